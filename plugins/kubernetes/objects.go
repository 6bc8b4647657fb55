package kubernetes

import (
	"github.com/estuary-mesh/estuary/sdk/istio"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// What the informers keep of each object. A cluster with 100,000 pods
// spends most of its memory on the informer caches, so each transform keeps
// only the fields the plugin reads. Transforms run before anything else sees
// an object and may change it in place; they must be idempotent.

// slimMeta keeps name, namespace, labels, resource version and UID.
func slimMeta(m *metav1.ObjectMeta) {
	*m = metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, Labels: m.Labels, Annotations: m.Annotations,
		ResourceVersion: m.ResourceVersion, UID: m.UID,
	}
	// kubectl apply keeps a full copy of the object here.
	delete(m.Annotations, corev1.LastAppliedConfigAnnotation)
}

func transformService(obj any) (any, error) {
	if s, ok := obj.(*corev1.Service); ok {
		slimMeta(&s.ObjectMeta)
	}
	return obj, nil
}

func transformSlice(obj any) (any, error) {
	if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
		slimMeta(&s.ObjectMeta)
		s.Annotations = nil
		for i := range s.Endpoints {
			s.Endpoints[i].Hints = nil
			s.Endpoints[i].DeprecatedTopology = nil
		}
	}
	return obj, nil
}

// podInfo is what the pod informer keeps of a Pod. A Pod struct takes
// over 1 KB even with every field but a few cleared; this takes 300 bytes.
type podInfo struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	NodeName       string
	ServiceAccount string
}

var _ runtime.Object = (*podInfo)(nil)

// DeepCopyObject implements runtime.Object.
func (p *podInfo) DeepCopyObject() runtime.Object {
	out := *p
	p.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return &out
}

// transformPod turns a Pod into a podInfo; the informer stores and hands
// out only podInfos.
func transformPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a podInfo already, or a tombstone
	}
	slimMeta(&p.ObjectMeta)
	p.Annotations = nil
	return &podInfo{ObjectMeta: p.ObjectMeta, NodeName: p.Spec.NodeName, ServiceAccount: p.Spec.ServiceAccountName}, nil
}

func transformNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		slimMeta(&n.ObjectMeta)
		n.Annotations = nil
		n.Spec = corev1.NodeSpec{}
		n.Status = corev1.NodeStatus{Addresses: n.Status.Addresses}
	}
	return obj, nil
}

func transformNamespace(obj any) (any, error) {
	if n, ok := obj.(*corev1.Namespace); ok {
		slimMeta(&n.ObjectMeta)
		n.Annotations = nil
		n.Spec = corev1.NamespaceSpec{}
	}
	return obj, nil
}

func transformSecret(obj any) (any, error) {
	if s, ok := obj.(*corev1.Secret); ok {
		slimMeta(&s.ObjectMeta)
		s.Annotations = nil // may hold a copy of the data (last-applied-configuration)
		s.StringData = nil
	}
	return obj, nil
}

// Index functions.

func indexSliceService(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || s.Labels[labelServiceName] == "" {
		return nil, nil
	}
	return []string{s.Namespace + "/" + s.Labels[labelServiceName]}, nil
}

func indexSlicePods(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	var keys []string
	for i := range s.Endpoints {
		if ref := s.Endpoints[i].TargetRef; ref != nil && ref.Kind == "Pod" {
			ns := ref.Namespace
			if ns == "" {
				ns = s.Namespace
			}
			keys = append(keys, ns+"/"+ref.Name)
		}
	}
	return keys, nil
}

func indexSliceNodes(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	var keys []string
	for i := range s.Endpoints {
		if n := s.Endpoints[i].NodeName; n != nil && *n != "" && (len(keys) == 0 || keys[len(keys)-1] != *n) {
			keys = append(keys, *n)
		}
	}
	return keys, nil
}

func indexGateways(obj any) ([]string, error) {
	if s, ok := obj.(*corev1.Service); ok && s.Labels[istio.LabelNetwork] != "" {
		return []string{""}, nil
	}
	return nil, nil
}
