package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/estuary-mesh/estuary/sdk"
)

// Kubernetes Multi-Cluster Services (KEP-1645). A ServiceExport in a
// cluster exports the Service of the same namespace and name from that
// cluster: the cluster's instance then also reports the host
// NAME.NAMESPACE.svc.clusterset.local, with the Service's ports and the
// cluster's endpoints. Every exporting cluster reports it, and the host
// merges same-named services of several instances, so the clusterset host
// has the endpoints of exactly the clusters that export it. A
// ServiceImport (written by an MCS controller) gives the clusterset host
// its VIPs in its cluster (spec.ips of a ClusterSetIP import); a cluster
// that imports without exporting reports the host with those VIPs, the
// import's ports and no endpoints.

// clusterSetDomain is the KEP's domain of multi-cluster hosts.
const clusterSetDomain = "clusterset.local"

var (
	gvrServiceExport = mcsv1alpha1.SchemeGroupVersion.WithResource("serviceexports")
	gvrServiceImport = mcsv1alpha1.SchemeGroupVersion.WithResource("serviceimports")
)

// mcsWatch is a cluster's informers on ServiceExports and ServiceImports.
// They start only once discovery shows the API server serves the MCS API:
// an informer on a resource the server lacks would never sync.
type mcsWatch struct {
	factory          dynamicinformer.DynamicSharedInformerFactory
	exports, imports cache.SharedIndexInformer
	on               atomic.Bool // the API is served and the informers run
}

func newMCSWatch(c *cluster, dyn dynamic.Interface) (*mcsWatch, error) {
	m := &mcsWatch{factory: dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)}
	m.exports = m.factory.ForResource(gvrServiceExport).Informer()
	m.imports = m.factory.ForResource(gvrServiceImport).Informer()
	for _, s := range []struct {
		inf       cache.SharedIndexInformer
		transform cache.TransformFunc
	}{{m.exports, transformServiceExport}, {m.imports, transformServiceImport}} {
		if err := s.inf.SetTransform(s.transform); err != nil {
			return nil, err
		}
		if err := s.inf.SetWatchErrorHandler(c.onWatchError); err != nil {
			return nil, err
		}
		if _, err := s.inf.AddEventHandler(handlerFuncs(c.onMCSObject)); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// start asks discovery whether the cluster serves the MCS API (retrying
// while the API server cannot answer) and, if it does, starts the
// informers. It returns their HasSynced functions, or why MCS is off in
// this cluster.
func (m *mcsWatch) start(ctx context.Context, c *cluster) ([]cache.InformerSynced, string) {
	gv := mcsv1alpha1.SchemeGroupVersion.String()
	var served bool
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(context.Context) (bool, error) {
		_, err := c.client.Discovery().ServerResourcesForGroupVersion(gv)
		switch {
		case err == nil:
			served = true
			return true, nil
		case apierrors.IsNotFound(err):
			return true, nil
		}
		c.log.Debug("MCS API discovery failed; retrying", "server", c.server, "error", err)
		return false, nil
	})
	if err != nil {
		return nil, "" // stopped
	}
	if !served {
		return nil, fmt.Sprintf("the API server does not serve %s (ServiceExport, ServiceImport): no service of this cluster is exported; install the MCS CRDs and reconfigure or restart the plugin", gv)
	}
	m.factory.Start(ctx.Done())
	m.on.Store(true)
	return []cache.InformerSynced{m.exports.HasSynced, m.imports.HasSynced}, ""
}

// exported reports whether a ServiceExport names namespace/name.
func (m *mcsWatch) exported(namespace, name string) bool {
	if !m.on.Load() {
		return false
	}
	_, ok, _ := m.exports.GetIndexer().GetByKey(namespace + "/" + name)
	return ok
}

// serviceImport returns the ServiceImport namespace/name, or nil.
func (m *mcsWatch) serviceImport(namespace, name string) *mcsv1alpha1.ServiceImport {
	if !m.on.Load() {
		return nil
	}
	o, ok, _ := m.imports.GetIndexer().GetByKey(namespace + "/" + name)
	if !ok {
		return nil
	}
	si, _ := o.(*mcsv1alpha1.ServiceImport)
	return si
}

// importKeys lists the ServiceImports as "namespace/name".
func (m *mcsWatch) importKeys() []string {
	if !m.on.Load() {
		return nil
	}
	return m.imports.GetStore().ListKeys()
}

// transformServiceExport keeps only the export's slim metadata: that it
// exists is all the plugin reads (its conditions are the MCS controller's).
func transformServiceExport(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Name: u.GetName(), Namespace: u.GetNamespace(), ResourceVersion: u.GetResourceVersion(), UID: u.GetUID(),
	}}
	m.SetGroupVersionKind(mcsv1alpha1.SchemeGroupVersion.WithKind("ServiceExport"))
	return m, nil
}

// transformServiceImport converts the import to its typed form, keeping
// its spec and slim metadata. One that does not convert is kept as an
// import without IPs or ports, and logged by its events.
func transformServiceImport(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	si := &mcsv1alpha1.ServiceImport{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, si); err != nil {
		si = &mcsv1alpha1.ServiceImport{}
		si.Name, si.Namespace = u.GetName(), u.GetNamespace()
	}
	slimMeta(&si.ObjectMeta)
	si.Annotations, si.Labels = nil, nil
	si.Status = mcsv1alpha1.ServiceImportStatus{}
	return si, nil
}

// onMCSObject queues the service a ServiceExport or ServiceImport names.
func (c *cluster) onMCSObject(oldObj, curObj any) {
	if !c.live.Load() {
		return
	}
	obj := curObj
	if obj == nil {
		obj = oldObj
	}
	if m, ok := obj.(metav1.Object); ok {
		c.enqueueService(m.GetNamespace(), m.GetName())
	}
}

// clusterSetHostname is NAME.NAMESPACE.svc.clusterset.local.
func clusterSetHostname(namespace, name string) string {
	return name + "." + namespace + ".svc." + clusterSetDomain
}

// clusterSetService is what this cluster reports for the clusterset host
// of namespace/name: svc (nil if the cluster has no such Service, or does
// not watch its namespace) exported, with its endpoints eps (shared with
// its cluster.local host, never modified), or a ServiceImport, or nothing.
func (c *cluster) clusterSetService(svc *corev1.Service, eps []sdk.Endpoint, namespace, name string) (*sdk.Service, []sdk.Endpoint) {
	m := c.mcs
	if m == nil || !m.on.Load() || !c.discovered(namespace) {
		return nil, nil
	}
	imp := m.serviceImport(namespace, name)
	var out *sdk.Service
	switch {
	case svc != nil && m.exported(namespace, name):
		out = c.conv.service(svc)
		// This cluster's ClusterIPs, external addresses and node ports
		// belong to its cluster.local host; the clusterset host's VIPs
		// are the import's.
		out.VIPs, out.ExternalAddresses, out.NodePorts = nil, nil, nil
	case imp != nil:
		out, eps = &sdk.Service{Namespace: namespace, Name: name}, nil
		for _, p := range imp.Spec.Ports {
			if p.Protocol == corev1.ProtocolSCTP {
				continue
			}
			sp := corev1.ServicePort{Name: p.Name, Port: p.Port, Protocol: p.Protocol, AppProtocol: p.AppProtocol}
			out.Ports = append(out.Ports, sdk.Port{Name: p.Name, Number: uint32(p.Port), Protocol: protocol(sp)})
		}
		if imp.Spec.Type == mcsv1alpha1.Headless {
			out.Resolution = sdk.ResolutionPassthrough
		}
	default:
		return nil, nil
	}
	out.Hostname = clusterSetHostname(namespace, name)
	out.ClusterLocal = false // the clusterset host spans the clusters that export it
	if imp != nil && imp.Spec.Type == mcsv1alpha1.ClusterSetIP && out.Resolution == sdk.ResolutionStatic {
		if ips := slices.DeleteFunc(slices.Clone(imp.Spec.IPs), func(ip string) bool { return ip == "" }); len(ips) > 0 {
			out.VIPs = map[string][]string{c.spec.id: ips}
		}
	}
	return out, eps
}

// publishClusterSet upserts or deletes the clusterset host of
// namespace/name; see clusterSetService.
func (c *cluster) publishClusterSet(svc *corev1.Service, eps []sdk.Endpoint, namespace, name string) {
	if c.mcs == nil {
		return
	}
	hostname := clusterSetHostname(namespace, name)
	s, eps := c.clusterSetService(svc, eps, namespace, name)
	if s == nil {
		if err := c.state.DeleteService(c.id, hostname); err != nil {
			c.log.Error("delete service", "service", hostname, "error", err)
		}
		return
	}
	if err := c.state.UpsertService(c.id, s); err != nil {
		c.log.Error("upsert service", "service", hostname, "error", err)
		return
	}
	if err := c.state.SetEndpoints(c.id, hostname, eps); err != nil {
		c.log.Error("set endpoints", "service", hostname, "error", err)
	}
}
