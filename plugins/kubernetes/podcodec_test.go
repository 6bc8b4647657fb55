package kubernetes

import (
	"bytes"
	"fmt"
	"maps"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
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

// Pods are listed in pages: every page's pods reach the endpoints, and the
// watch that follows the list sees later changes.
func TestPodsListedInPages(t *testing.T) {
	podPageSize = 2
	t.Cleanup(func() { podPageSize = 5000 }) // after the plugin (a later cleanup) has stopped

	tb := testbed.StartKube(t)
	k := kube{t, tb.Client()}
	k.node("n1", nil)
	ns := k.namespace("paged", nil)
	var eps []epSpec
	for i := range 5 {
		name := fmt.Sprintf("p%d", i)
		k.pod(ns, name, map[string]string{"app": "echo", "pod": name}, "n1", "sa-"+name)
		eps = append(eps, epSpec{addr: fmt.Sprintf("10.20.0.%d", i+1), pod: name, node: "n1", ready: ready(true)})
	}
	k.service(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	})
	k.slice(endpointSlice(ns, "echo-1", "echo", map[string]int32{"http": 8080}, eps...))

	h := sdktest.Start(t, Factory)
	h.Configure(t, fmt.Sprintf("kubeconfig = %q\ncluster_id = \"c1\"\n", tb.Kubeconfig), sdk.MeshSettings{DomainSuffix: "cluster.local"})
	w := h.Watch(t)
	host := "echo." + ns + ".svc.cluster.local"
	identities := func(r *sdktest.Replica) map[string]string {
		out := map[string]string{}
		if in := instance(r, "c1"); in != nil {
			for _, e := range in.Endpoints[host] {
				out[e.Address] = e.ServiceAccount + " " + e.Labels["pod"] + " " + e.Labels["version"]
			}
		}
		return out
	}
	want := map[string]string{}
	for i := range 5 {
		want[fmt.Sprintf("10.20.0.%d", i+1)] = fmt.Sprintf("spiffe://cluster.local/ns/%s/sa/sa-p%d p%d ", ns, i, i)
	}
	w.WaitFor(t, waitTimeout, "every pod of every page", func(r *sdktest.Replica) bool {
		return sdktest.AllSynced(r) && maps.Equal(identities(r), want)
	})

	p, err := k.c.CoreV1().Pods(ns).Get(ctxb, "p4", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Labels["version"] = "v2"
	if _, err := k.c.CoreV1().Pods(ns).Update(ctxb, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want["10.20.0.5"] += "v2"
	w.WaitFor(t, waitTimeout, "the pod's new label", func(r *sdktest.Replica) bool { return maps.Equal(identities(r), want) })
}
