package kubernetes

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	kubeclient "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/connrotation"
	"k8s.io/client-go/util/workqueue"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
	"github.com/estuary-mesh/estuary/sdk/redact"
)

// clusterSpec is what a cluster connection needs to know about its place in
// the mesh.
type clusterSpec struct {
	id   string // cluster ID
	opts *options
	// network is the fallback network of the cluster's endpoints when its
	// system namespace has no topology.istio.io/network label.
	network string
	// syncTimeout is the instance's SyncTimeout property (remote clusters).
	syncTimeout time.Duration
}

// cluster is one connection to one cluster's API server: a client, shared
// informers on Services, EndpointSlices, Pods, Nodes and Namespaces, and a
// worker that turns their changes into the cluster's instance in the State.
//
// A cluster publishes nothing until it is activated. A remote cluster whose
// kubeconfig is rotated gets a second, inactive cluster for the same
// instance, which syncs in the background and is activated when the first
// one is stopped: that is how a rotation never empties the instance.
// Stopping a cluster never removes its instance.
type cluster struct {
	spec  clusterSpec
	id    sdk.InstanceID
	state *sdk.State
	log   hclog.Logger

	client     kubeclient.Interface
	httpClient *http.Client
	dialer     *connrotation.Dialer
	server     string // API server URL, for messages

	factory                                             informers.SharedInformerFactory
	serviceInf, sliceInf, podInf, nodeInf, namespaceInf cache.SharedIndexInformer
	queue                                               workqueue.TypedInterface[workItem]
	conv                                                converter // owned by the worker goroutine
	// mcs watches ServiceExports and ServiceImports; nil unless the
	// config's mcs is on.
	mcs *mcsWatch

	ctx          context.Context
	cancel       context.CancelFunc
	started      atomic.Bool
	done         chan struct{} // closed when run returns
	synced       chan struct{} // closed when the informers have synced
	activateOnce sync.Once
	active       chan struct{} // closed by activate
	// live is set once the first snapshot is being built: from then on
	// informer events are queued for the worker.
	live atomic.Bool

	mu        sync.Mutex // guards the fields below and the order of SetHealth calls
	activated bool
	stopped   bool
	published bool              // this cluster's first snapshot is in the State
	inherited bool              // the instance holds state a previous client published
	failures  map[string]string // request path -> last failure, "" when it succeeded
	gwNotices []sdk.Notice
	mcsNotice []sdk.Notice // why MCS is off in this cluster
	extra     []sdk.Notice // notices of others about this instance (the primary's secrets)
	// svcNotices are problems with services' annotations, by namespace/name.
	svcNotices map[string]sdk.Notice
}

// workItem is one thing the worker recomputes.
type workItem struct {
	kind      itemKind
	namespace string
	name      string
}

type itemKind uint8

const (
	itemService  itemKind = iota + 1 // one service and its endpoints
	itemGateways                     // the cluster's network gateways
	itemAll                          // everything, e.g. after the cluster's network changed
)

// Index names on the informers.
const (
	indexByService = "service" // EndpointSlices by "namespace/service"
	indexByPod     = "pod"     // EndpointSlices by "namespace/pod" of their endpoints
	indexByNode    = "node"    // EndpointSlices by node names of their endpoints
	indexGateway   = "gateway" // Services labelled topology.istio.io/network, under ""
)

// newCluster builds the client and informers of one cluster; start runs them.
func newCluster(spec clusterSpec, rc *rest.Config, state *sdk.State, log hclog.Logger) (*cluster, error) {
	c := &cluster{
		spec:     spec,
		id:       sdk.InstanceID{Provider: sdk.ProviderKubernetes, Cluster: spec.id},
		state:    state,
		log:      log.With("cluster", spec.id, "provider", sdk.ProviderKubernetes),
		server:   redact.URL(rc.Host), // shown in logs and health: no credentials
		done:     make(chan struct{}),
		synced:   make(chan struct{}),
		active:   make(chan struct{}),
		failures: map[string]string{},
		conv: converter{
			clusterID:    spec.id,
			domainSuffix: spec.opts.domainSuffix,
			trustDomain:  spec.opts.trustDomain,
			network:      spec.network,
			clusterLocal: spec.opts.clusterSetOnly,
		},
	}
	var err error
	var crc *rest.Config
	c.client, crc, c.httpClient, c.dialer, err = newClient(rc, c.observe)
	if err != nil {
		return nil, fmt.Errorf("cluster %q: %w", spec.id, err)
	}
	c.factory = informers.NewSharedInformerFactoryWithOptions(c.client, 0)
	c.serviceInf = c.factory.Core().V1().Services().Informer()
	c.sliceInf = c.factory.Discovery().V1().EndpointSlices().Informer()
	if fullPodDecode {
		c.podInf = c.factory.Core().V1().Pods().Informer()
	} else {
		newPodInf, err := newPodInformer(crc, c.httpClient)
		if err != nil {
			return nil, fmt.Errorf("cluster %q: %w", spec.id, err)
		}
		// Through the factory, which starts it and waits for it on Shutdown.
		c.podInf = c.factory.InformerFor(&podInfo{}, newPodInf)
	}
	c.nodeInf = c.factory.Core().V1().Nodes().Informer()
	c.namespaceInf = c.factory.Core().V1().Namespaces().Informer()
	c.queue = workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[workItem]{Name: ""})
	if spec.opts.mcs {
		dyn, err := dynamic.NewForConfigAndClient(rest.CopyConfig(rc), c.httpClient)
		if err != nil {
			return nil, fmt.Errorf("cluster %q: %w", spec.id, err)
		}
		if c.mcs, err = newMCSWatch(c, dyn); err != nil {
			return nil, err
		}
	}

	setup := []struct {
		inf       cache.SharedIndexInformer
		transform cache.TransformFunc
		indexers  cache.Indexers
		handler   func(old, cur any)
	}{
		{c.serviceInf, transformService, cache.Indexers{indexGateway: indexGateways}, c.onService},
		{c.sliceInf, transformSlice, cache.Indexers{indexByService: indexSliceService, indexByPod: indexSlicePods, indexByNode: indexSliceNodes}, c.onSlice},
		{c.podInf, transformPod, nil, c.onPod},
		{c.nodeInf, transformNode, nil, c.onNode},
		{c.namespaceInf, transformNamespace, nil, c.onNamespace},
	}
	for _, s := range setup {
		if err := s.inf.SetTransform(s.transform); err != nil {
			return nil, err
		}
		if s.indexers != nil {
			if err := s.inf.AddIndexers(s.indexers); err != nil {
				return nil, err
			}
		}
		if err := s.inf.SetWatchErrorHandler(c.onWatchError); err != nil {
			return nil, err
		}
		if _, err := s.inf.AddEventHandler(handlerFuncs(s.handler)); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// newClient builds a clientset with a transport of its own: its connections
// are closed when the cluster stops (no goroutine outlives it), and every
// response is reported to observe, which tracks the cluster's health. It
// also returns the config the clientset was built from, for other clients
// on the same transport.
func newClient(rc *rest.Config, observe func(*http.Request, *http.Response, error)) (kubeclient.Interface, *rest.Config, *http.Client, *connrotation.Dialer, error) {
	rc = rest.CopyConfig(rc)
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	rc.UserAgent = "estuary-plugin-kubernetes/" + Version
	if rc.QPS == 0 {
		rc.QPS, rc.Burst = 50, 100
	}
	dialer := connrotation.NewDialer((&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
	rc.Dial = dialer.DialContext
	if rc.Proxy == nil {
		// Also keeps client-go from sharing (and caching forever) the transport.
		rc.Proxy = http.ProxyFromEnvironment
	}
	if !unbufferedBodies {
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return bufferedBodies{next: rt} })
	}
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &observer{next: rt, observe: observe} })
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("client for %s: %w", redact.URL(rc.Host), err)
	}
	cs, err := kubeclient.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("client for %s: %w", redact.URL(rc.Host), err)
	}
	return cs, rc, hc, dialer, nil
}

// bufferedBodies reads the API server's answers to GETs through a buffer.
// client-go decodes a watch one frame, one object, at a time, and over
// HTTP/2 each read that frees 4 KB or more of flow-control window makes
// the transport send a WINDOW_UPDATE frame and flush it: a write system
// call (and a frame for the API server to read) every few pods of a
// 100,000-pod initial watch list. Reading in chunks of up to bodyBuffer
// sends one per chunk. A read takes only what has arrived, so no event
// waits for the buffer to fill.
type bufferedBodies struct{ next http.RoundTripper }

// bodyBuffer is the read-ahead of each response: a few watches per
// cluster keep one open.
const bodyBuffer = 64 << 10

// unbufferedBodies turns bufferedBodies off; only BenchmarkColdSync sets
// it, to compare both in one run.
var unbufferedBodies = false

func (b bufferedBodies) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(req)
	if err == nil && req.Method == http.MethodGet && resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = bufferedBody{Reader: bufio.NewReaderSize(resp.Body, bodyBuffer), Closer: resp.Body}
	}
	return resp, err
}

// WrappedRoundTripper lets client-go reach the transport underneath.
func (b bufferedBodies) WrappedRoundTripper() http.RoundTripper { return b.next }

type bufferedBody struct {
	*bufio.Reader
	io.Closer
}

// start runs the informers and the worker. The cluster publishes once it is
// activated and synced.
func (c *cluster) start(ctx context.Context) {
	c.ctx, c.cancel = context.WithCancel(ctx)
	c.started.Store(true)
	c.factory.Start(c.ctx.Done())
	go c.run()
}

// stop stops the informers and the worker and closes the connections. The
// instance keeps what the cluster last published.
func (c *cluster) stop() {
	c.mu.Lock()
	already := c.stopped
	c.stopped = true
	c.mu.Unlock()
	if already || !c.started.Load() {
		return
	}
	c.cancel()
	c.queue.ShutDown()
	c.factory.Shutdown()
	if c.mcs != nil {
		c.mcs.factory.Shutdown()
	}
	<-c.done
	c.dialer.CloseAll()
	utilnet.CloseIdleConnectionsFor(c.httpClient.Transport)
}

// activate announces the instance and lets the cluster publish once it has
// synced. It is called once, for the first client of an instance.
func (c *cluster) activate() {
	c.activateOnce.Do(func() { c.doActivate(false) })
}

// takeOver lets a cluster publish into an instance that a previous client
// of the same cluster filled: the instance keeps that state, properties
// included, until this cluster has synced and replaces it.
func (c *cluster) takeOver() {
	c.activateOnce.Do(func() { c.doActivate(true) })
}

func (c *cluster) doActivate(takeOver bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return
	}
	c.activated = true
	c.inherited = takeOver
	if !takeOver {
		c.state.SetInstance(c.id, c.properties(c.spec.network))
	}
	c.publishHealthLocked()
	close(c.active)
}

func (c *cluster) properties(network string) sdk.InstanceProperties {
	return sdk.InstanceProperties{ClusterScoped: true, DefaultNetwork: network, SyncTimeout: c.spec.syncTimeout}
}

func (c *cluster) run() {
	defer close(c.done)
	hasSynced := []cache.InformerSynced{c.serviceInf.HasSynced, c.sliceInf.HasSynced, c.podInf.HasSynced, c.nodeInf.HasSynced, c.namespaceInf.HasSynced}
	if c.mcs != nil {
		synced, off := c.mcs.start(c.ctx, c)
		if c.ctx.Err() != nil {
			return
		}
		hasSynced = append(hasSynced, synced...)
		if off != "" {
			c.log.Warn("MCS is off in this cluster", "server", c.server, "error", off)
			c.mu.Lock()
			c.mcsNotice = []sdk.Notice{{Subject: "cluster " + c.spec.id + " MCS", Message: off}}
			c.publishHealthLocked()
			c.mu.Unlock()
		}
	}
	err := wait.PollUntilContextCancel(c.ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, f := range hasSynced {
			if !f() {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return // stopped
	}
	c.log.Debug("informers synced", "server", c.server)
	close(c.synced)
	select {
	case <-c.active:
	case <-c.ctx.Done():
		return
	}
	// From here every event is queued. Anything an earlier event changed is
	// already in the caches the snapshot reads.
	c.live.Store(true)
	t0 := time.Now()
	n := c.publishAll()
	c.mu.Lock()
	c.published = true
	if err := c.state.MarkSynced(c.id); err != nil {
		c.log.Error("mark synced", "error", err)
	}
	c.publishHealthLocked()
	c.mu.Unlock()
	c.log.Info("cluster synced", "services", n, "duration", time.Since(t0).String())
	for {
		item, shutdown := c.queue.Get()
		if shutdown {
			return
		}
		c.process(item)
		c.queue.Done(item)
	}
}

func (c *cluster) process(item workItem) {
	switch item.kind {
	case itemService:
		c.publishService(item.namespace, item.name)
	case itemGateways:
		c.publishGateways()
	case itemAll:
		c.publishAll()
	}
}

// publishAll replaces the instance with what the caches hold. It returns
// the number of services.
func (c *cluster) publishAll() int {
	network := c.network()
	c.conv.network = network
	c.state.SetInstance(c.id, c.properties(network))
	objs := c.serviceInf.GetStore().List()
	snap := sdk.Snapshot{Services: make([]*sdk.Service, 0, len(objs)), Endpoints: make(map[string][]sdk.Endpoint, len(objs))}
	for _, o := range objs {
		svc := o.(*corev1.Service)
		if !c.discovered(svc.Namespace) {
			continue
		}
		s := c.conv.service(svc)
		c.noteService(svc.Namespace, svc.Name, annotationErr(svc))
		snap.Services = append(snap.Services, s)
		eps := c.conv.endpoints(svc, c.slicesOf(svc.Namespace, svc.Name), c)
		snap.Endpoints[s.Hostname] = eps
		if cs, eps := c.clusterSetService(svc, eps, svc.Namespace, svc.Name); cs != nil {
			snap.Services = append(snap.Services, cs)
			snap.Endpoints[cs.Hostname] = eps
		}
	}
	if c.mcs != nil {
		// Imports of services this cluster does not have.
		for _, key := range c.mcs.importKeys() {
			ns, name, _ := strings.Cut(key, "/")
			if _, ok, _ := c.serviceInf.GetIndexer().GetByKey(key); ok {
				continue // done above
			}
			if cs, eps := c.clusterSetService(nil, nil, ns, name); cs != nil {
				snap.Services = append(snap.Services, cs)
				snap.Endpoints[cs.Hostname] = eps
			}
		}
	}
	gws, notices := c.gateways()
	snap.Gateways = gws
	if err := c.state.ReplaceInstance(c.id, snap); err != nil {
		c.log.Error("publish snapshot", "error", err)
	}
	c.setGatewayNotices(notices)
	return len(snap.Services)
}

func (c *cluster) publishService(namespace, name string) {
	hostname := c.conv.hostname(namespace, name)
	obj, ok, _ := c.serviceInf.GetIndexer().GetByKey(namespace + "/" + name)
	if !ok || !c.discovered(namespace) {
		c.noteService(namespace, name, nil)
		if err := c.state.DeleteService(c.id, hostname); err != nil {
			c.log.Error("delete service", "service", hostname, "error", err)
		}
		c.publishClusterSet(nil, nil, namespace, name)
		return
	}
	svc := obj.(*corev1.Service)
	c.noteService(namespace, name, annotationErr(svc))
	eps := c.conv.endpoints(svc, c.slicesOf(namespace, name), c)
	defer c.publishClusterSet(svc, eps, namespace, name)
	if err := c.state.UpsertService(c.id, c.conv.service(svc)); err != nil {
		c.log.Error("upsert service", "service", hostname, "error", err)
		return
	}
	if err := c.state.SetEndpoints(c.id, hostname, eps); err != nil {
		c.log.Error("set endpoints", "service", hostname, "error", err)
	}
}

func (c *cluster) publishGateways() {
	gws, notices := c.gateways()
	if err := c.state.SetGateways(c.id, gws); err != nil {
		c.log.Error("set gateways", "error", err)
	}
	c.setGatewayNotices(notices)
}

func (c *cluster) gateways() ([]sdk.NetworkGateway, []sdk.Notice) {
	objs, _ := c.serviceInf.GetIndexer().ByIndex(indexGateway, "")
	svcs := make([]*corev1.Service, 0, len(objs))
	for _, o := range objs {
		if svc := o.(*corev1.Service); c.discovered(svc.Namespace) {
			svcs = append(svcs, svc)
		}
	}
	slices.SortFunc(svcs, func(a, b *corev1.Service) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return gateways(c.spec.id, svcs, c)
}

// network is the default network of the cluster's endpoints: the system
// namespace's topology.istio.io/network label, else the spec's.
func (c *cluster) network() string {
	if o, ok, _ := c.namespaceInf.GetIndexer().GetByKey(c.spec.opts.systemNamespace); ok {
		if n := o.(*corev1.Namespace).Labels[istio.LabelNetwork]; n != "" {
			return n
		}
	}
	return c.spec.network
}

// discovered reports whether discovery_namespaces selects the namespace.
func (c *cluster) discovered(namespace string) bool {
	if len(c.spec.opts.discovery) == 0 {
		return true
	}
	o, ok, _ := c.namespaceInf.GetIndexer().GetByKey(namespace)
	return ok && c.selects(o.(*corev1.Namespace))
}

func (c *cluster) selects(ns *corev1.Namespace) bool {
	if ns == nil {
		return false
	}
	if len(c.spec.opts.discovery) == 0 {
		return true
	}
	for _, sel := range c.spec.opts.discovery {
		if sel.Matches(labels.Set(ns.Labels)) {
			return true
		}
	}
	return false
}

func (c *cluster) slicesOf(namespace, name string) []*discoveryv1.EndpointSlice {
	objs, _ := c.sliceInf.GetIndexer().ByIndex(indexByService, namespace+"/"+name)
	out := make([]*discoveryv1.EndpointSlice, len(objs))
	for i, o := range objs {
		out[i] = o.(*discoveryv1.EndpointSlice)
	}
	// Deterministic: which slice wins for an address listed twice.
	slices.SortFunc(out, func(a, b *discoveryv1.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// pod and node implement objects and gatewayObjects.
func (c *cluster) pod(namespace, name string) *podInfo {
	o, ok, _ := c.podInf.GetIndexer().GetByKey(namespace + "/" + name)
	if !ok {
		return nil
	}
	return o.(*podInfo)
}

func (c *cluster) node(name string) *corev1.Node {
	if name == "" {
		return nil
	}
	o, ok, _ := c.nodeInf.GetIndexer().GetByKey(name)
	if !ok {
		return nil
	}
	return o.(*corev1.Node)
}

func (c *cluster) nodes() []*corev1.Node {
	objs := c.nodeInf.GetStore().List()
	out := make([]*corev1.Node, len(objs))
	for i, o := range objs {
		out[i] = o.(*corev1.Node)
	}
	return out
}

func (c *cluster) endpointNodes(svc *corev1.Service) map[string]bool {
	out := map[string]bool{}
	for _, s := range c.slicesOf(svc.Namespace, svc.Name) {
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			if !isReady(e) {
				continue
			}
			switch {
			case e.NodeName != nil:
				out[*e.NodeName] = true
			case e.TargetRef != nil && e.TargetRef.Kind == "Pod":
				if p := c.pod(cmp.Or(e.TargetRef.Namespace, s.Namespace), e.TargetRef.Name); p != nil && p.NodeName != "" {
					out[p.NodeName] = true
				}
			}
		}
	}
	return out
}
