package kubernetes

import (
	"bytes"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
)

// The pod decoder must give the podInfo that decoding a whole Pod and
// transforming it gives, from protobuf and from JSON, for pods and lists.
func TestPodDecoder(t *testing.T) {
	now := metav1.Now()
	pod := func(name string, labels map[string]string) corev1.Pod {
		return corev1.Pod{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: "uid-" + "name", ResourceVersion: "42",
				GenerateName: "gen-", Generation: 3, CreationTimestamp: now, DeletionTimestamp: &now,
				DeletionGracePeriodSeconds: ptr.To[int64](30), Labels: labels,
				Annotations:     map[string]string{corev1.LastAppliedConfigAnnotation: "{}", "other": "x"},
				OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "rs"}}, Finalizers: []string{"f"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply,
					FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{}}`)}}}},
			Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "sa-" + name, DeprecatedServiceAccount: "old",
				TerminationGracePeriodSeconds: ptr.To[int64](30), Hostname: "h",
				Containers: []corev1.Container{{Name: "c", Image: "i", Ports: []corev1.ContainerPort{{ContainerPort: 80}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
	}
	want := func(p corev1.Pod) *podInfo {
		out, _ := transformPod(p.DeepCopy())
		return out.(*podInfo)
	}
	labelled := pod("a", map[string]string{"app": "a", "version": "v1", "security.istio.io/tlsMode": "istio"})
	bare := pod("b", nil)
	bare.Spec.NodeName, bare.Spec.ServiceAccountName = "", ""
	list := &corev1.PodList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodList"},
		ListMeta: metav1.ListMeta{ResourceVersion: "99", Continue: "next", RemainingItemCount: ptr.To[int64](7)},
		Items:    []corev1.Pod{labelled, bare}}

	for _, info := range (podSerializer{base: scheme.Codecs.WithoutConversion()}).SupportedMediaTypes() {
		if info.MediaType != runtime.ContentTypeProtobuf && info.MediaType != runtime.ContentTypeJSON {
			continue
		}
		enc := scheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion)
		if info.MediaType == runtime.ContentTypeProtobuf {
			enc = info.Serializer // podDecoder encodes as the protobuf serializer does
		}
		encode := func(obj runtime.Object) []byte {
			var b bytes.Buffer
			if err := enc.Encode(obj, &b); err != nil {
				t.Fatal(err)
			}
			return b.Bytes()
		}
		dec := info.Serializer
		t.Run(info.MediaType, func(t *testing.T) {
			for _, p := range []corev1.Pod{labelled, bare} {
				got, _, err := dec.Decode(encode(&p), nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want(p)) {
					t.Errorf("pod %s: got %#v, want %#v", p.Name, got, want(p))
				}
			}
			got, _, err := dec.Decode(encode(list), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			wantList := &podInfoList{ListMeta: list.ListMeta, Items: []podInfo{*want(labelled), *want(bare)}}
			if !reflect.DeepEqual(got, wantList) {
				t.Errorf("list: got %#v, want %#v", got, wantList)
			}

			// A watch list's closing bookmark is a Pod with one annotation,
			// which the reflector reads.
			bookmark := &corev1.Pod{TypeMeta: labelled.TypeMeta, ObjectMeta: metav1.ObjectMeta{ResourceVersion: "100",
				Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
			got, _, err = dec.Decode(encode(bookmark), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if bm, ok := got.(*podInfo); !ok || bm.Annotations[metav1.InitialEventsAnnotationKey] != "true" || bm.ResourceVersion != "100" {
				t.Errorf("bookmark: got %#v", got)
			}

			// Anything else is decoded as client-go decodes it.
			status := &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusFailure,
				Reason: metav1.StatusReasonExpired, Message: "too old", Code: 410}
			got, _, err = dec.Decode(encode(status), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if s, ok := got.(*metav1.Status); !ok || s.Reason != metav1.StatusReasonExpired || s.Code != 410 {
				t.Errorf("status: got %#v", got)
			}
		})
	}

	t.Run("truncated", func(t *testing.T) {
		var b bytes.Buffer
		dec := podDecoder{Serializer: protobufSerializer(t), protobuf: true}
		if err := dec.Encode(&labelled, &b); err != nil {
			t.Fatal(err)
		}
		if _, _, err := dec.Decode(b.Bytes()[:b.Len()-3], nil, nil); err == nil {
			t.Errorf("a truncated Pod decoded without error")
		}
	})
}

func protobufSerializer(t *testing.T) runtime.Serializer {
	for _, info := range scheme.Codecs.WithoutConversion().SupportedMediaTypes() {
		if info.MediaType == runtime.ContentTypeProtobuf {
			return info.Serializer
		}
	}
	t.Fatal("no protobuf serializer")
	return nil
}
