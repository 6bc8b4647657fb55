package kubernetes

import (
	"github.com/estuary-mesh/estuary/sdk/istio"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestTransforms(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	lastApplied := map[string]string{corev1.LastAppliedConfigAnnotation: `{"big": "copy"}`, istio.LabelGatewayPort: "16443"}

	t.Run("pod becomes podInfo", func(t *testing.T) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"app": "a"}, ResourceVersion: "7",
				Annotations: maps.Clone(lastApplied), ManagedFields: managed},
			Spec:   corev1.PodSpec{NodeName: "n1", ServiceAccountName: "sa", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
			Status: corev1.PodStatus{PodIP: "10.0.0.1", Conditions: []corev1.PodCondition{{Type: corev1.PodReady}}},
		}
		out, err := transformPod(pod)
		if err != nil {
			t.Fatal(err)
		}
		pi, ok := out.(*podInfo)
		if !ok {
			t.Fatalf("transformPod returned %T", out)
		}
		if pi.Name != "p" || pi.Namespace != "ns" || pi.Labels["app"] != "a" || pi.ResourceVersion != "7" ||
			pi.NodeName != "n1" || pi.ServiceAccount != "sa" || pi.Annotations != nil || pi.ManagedFields != nil {
			t.Errorf("podInfo = %+v", pi)
		}
		again, _ := transformPod(pi)
		if again != pi {
			t.Errorf("transformPod is not idempotent on a podInfo")
		}
		cp := pi.DeepCopyObject().(*podInfo)
		cp.Labels["app"] = "changed"
		if pi.Labels["app"] != "a" {
			t.Errorf("DeepCopyObject shares the labels map")
		}
	})

	t.Run("service keeps annotations but not kubectl's copy", func(t *testing.T) {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", Annotations: maps.Clone(lastApplied), ManagedFields: managed}}
		transformService(svc)
		if svc.ManagedFields != nil || !maps.Equal(svc.Annotations, map[string]string{istio.LabelGatewayPort: "16443"}) {
			t.Errorf("service meta = %+v", svc.ObjectMeta)
		}
	})

	t.Run("secret keeps only its data", func(t *testing.T) {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "s", Labels: map[string]string{istio.LabelMultiCluster: "true"}, Annotations: maps.Clone(lastApplied)},
			Data:       map[string][]byte{"c2": []byte("kubeconfig")},
			StringData: map[string]string{"c2": "kubeconfig"},
		}
		transformSecret(s)
		if s.Annotations != nil || s.StringData != nil || string(s.Data["c2"]) != "kubeconfig" || s.Labels[istio.LabelMultiCluster] != "true" {
			t.Errorf("secret = %+v", s)
		}
	})

	t.Run("node keeps labels and addresses", func(t *testing.T) {
		n := nodeObj("n", map[string]string{corev1.LabelTopologyZone: "z"}, "203.0.113.1")
		n.Status.Images = []corev1.ContainerImage{{Names: []string{"big"}}}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady}}
		n.Spec.PodCIDR = "10.244.0.0/24"
		transformNode(n)
		if n.Status.Images != nil || n.Status.Conditions != nil || n.Spec.PodCIDR != "" || len(n.Status.Addresses) != 2 || n.Labels[corev1.LabelTopologyZone] != "z" {
			t.Errorf("node = %+v", n)
		}
	})
}

func TestSliceIndexes(t *testing.T) {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", Labels: map[string]string{labelServiceName: "svc"}},
		Endpoints: []discoveryv1.Endpoint{
			{TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "p1"}, NodeName: ptr.To("n1")},
			{TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "p2", Namespace: "other"}, NodeName: ptr.To("n1")},
			{TargetRef: &corev1.ObjectReference{Kind: "Node", Name: "n9"}, NodeName: ptr.To("n2")},
			{},
		},
	}
	tests := []struct {
		name  string
		index func(any) ([]string, error)
		want  []string
	}{
		{"service", indexSliceService, []string{"ns/svc"}},
		{"pods", indexSlicePods, []string{"ns/p1", "other/p2"}},
		{"nodes", indexSliceNodes, []string{"n1", "n2"}},
	}
	for _, tt := range tests {
		got, err := tt.index(s)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("%s index = %v, %v; want %v", tt.name, got, err, tt.want)
		}
	}
	if got, _ := indexSliceService(&discoveryv1.EndpointSlice{}); got != nil {
		t.Errorf("a slice without service label is indexed under %v", got)
	}
	gw := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{istio.LabelNetwork: "n"}}}
	if got, _ := indexGateways(gw); !slices.Equal(got, []string{""}) {
		t.Errorf("gateway index = %v", got)
	}
	if got, _ := indexGateways(&corev1.Service{}); got != nil {
		t.Errorf("a plain service is indexed as a gateway: %v", got)
	}
}
