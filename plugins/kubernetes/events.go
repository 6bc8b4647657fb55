package kubernetes

import (
	"github.com/estuary-mesh/estuary/sdk/istio"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// Informer events become work items for the cluster's worker: each names
// what to recompute (a service, the gateways, everything), and the worker
// reads the current objects from the caches. Queued items collapse, so a
// burst of changes to one service is recomputed once.

// handlerFuncs calls f with (nil, new) on add, (old, new) on update and
// (old, nil) on delete, unwrapping tombstones.
func handlerFuncs(f func(old, cur any)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { f(nil, obj) },
		UpdateFunc: f,
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			f(obj, nil)
		},
	}
}

func (c *cluster) enqueue(item workItem) {
	if c.live.Load() {
		c.queue.Add(item)
	}
}

func (c *cluster) enqueueService(namespace, name string) {
	c.enqueue(workItem{kind: itemService, namespace: namespace, name: name})
}

func (c *cluster) onService(oldObj, curObj any) {
	if !c.live.Load() {
		return
	}
	old, _ := oldObj.(*corev1.Service)
	cur, _ := curObj.(*corev1.Service)
	if old != nil && cur != nil && old.ResourceVersion == cur.ResourceVersion {
		return // a relist, nothing changed
	}
	some := cmpOr(cur, old)
	if some == nil {
		return
	}
	c.enqueueService(some.Namespace, some.Name)
	if (old != nil && old.Labels[istio.LabelNetwork] != "") || (cur != nil && cur.Labels[istio.LabelNetwork] != "") {
		c.enqueue(workItem{kind: itemGateways})
	}
}

func (c *cluster) onSlice(oldObj, curObj any) {
	if !c.live.Load() {
		return
	}
	old, _ := oldObj.(*discoveryv1.EndpointSlice)
	cur, _ := curObj.(*discoveryv1.EndpointSlice)
	if old != nil && cur != nil && old.ResourceVersion == cur.ResourceVersion {
		return
	}
	gateway := false
	for _, s := range []*discoveryv1.EndpointSlice{old, cur} {
		if s == nil || s.Labels[labelServiceName] == "" {
			continue
		}
		name := s.Labels[labelServiceName]
		c.enqueueService(s.Namespace, name)
		if o, ok, _ := c.serviceInf.GetIndexer().GetByKey(s.Namespace + "/" + name); ok && o.(*corev1.Service).Labels[istio.LabelNetwork] != "" {
			gateway = true // its endpoints decide which nodes are gateways (externalTrafficPolicy Local)
		}
	}
	if gateway {
		c.enqueue(workItem{kind: itemGateways})
	}
}

func (c *cluster) onPod(oldObj, curObj any) {
	if !c.live.Load() {
		return
	}
	old, _ := oldObj.(*podInfo)
	cur, _ := curObj.(*podInfo)
	if old != nil && cur != nil && !podChanged(old, cur) {
		return
	}
	p := cmpOr(cur, old)
	if p == nil {
		return
	}
	c.enqueueSlicesBy(indexByPod, p.Namespace+"/"+p.Name)
}

// podChanged reports a change in what endpoints take from a pod.
func podChanged(a, b *podInfo) bool {
	return a.NodeName != b.NodeName || a.ServiceAccount != b.ServiceAccount || !maps.Equal(a.Labels, b.Labels)
}

func (c *cluster) onNode(oldObj, curObj any) {
	if !c.live.Load() {
		return
	}
	old, _ := oldObj.(*corev1.Node)
	cur, _ := curObj.(*corev1.Node)
	if old != nil && cur != nil && maps.Equal(old.Labels, cur.Labels) && slices.Equal(old.Status.Addresses, cur.Status.Addresses) {
		return // status heartbeats and the like
	}
	n := cmpOr(cur, old)
	if n == nil {
		return
	}
	if old == nil || cur == nil || nodeLocality(old) != nodeLocality(cur) {
		c.enqueueSlicesBy(indexByNode, n.Name)
	}
	c.enqueue(workItem{kind: itemGateways})
}

func (c *cluster) onNamespace(oldObj, curObj any) {
	if !c.live.Load() {
		return
	}
	old, _ := oldObj.(*corev1.Namespace)
	cur, _ := curObj.(*corev1.Namespace)
	ns := cmpOr(cur, old)
	if ns == nil {
		return
	}
	label := func(n *corev1.Namespace) string {
		if n == nil {
			return ""
		}
		return n.Labels[istio.LabelNetwork]
	}
	if ns.Name == c.spec.opts.systemNamespace && label(old) != label(cur) {
		c.enqueue(workItem{kind: itemAll}) // the cluster's network changed
		return
	}
	if len(c.spec.opts.discovery) > 0 && c.selects(old) != c.selects(cur) {
		objs, _ := c.serviceInf.GetIndexer().ByIndex(cache.NamespaceIndex, ns.Name)
		for _, o := range objs {
			c.enqueueService(ns.Name, o.(*corev1.Service).Name)
		}
		c.enqueue(workItem{kind: itemGateways})
	}
}

// enqueueSlicesBy queues the services of the EndpointSlices under key in index.
func (c *cluster) enqueueSlicesBy(index, key string) {
	objs, _ := c.sliceInf.GetIndexer().ByIndex(index, key)
	for _, o := range objs {
		s := o.(*discoveryv1.EndpointSlice)
		if name := s.Labels[labelServiceName]; name != "" {
			c.enqueueService(s.Namespace, name)
		}
	}
}

func cmpOr[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}
