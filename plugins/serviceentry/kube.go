package serviceentry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/connrotation"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/backoff"
)

// Timing of the Kubernetes source: how often it looks for the CRDs while
// they are not installed, the bounds of its retry backoff while the API
// server cannot be reached, and how often it probes the server's health.
var (
	crdPoll        = 5 * time.Second
	kubeRetryFirst = time.Second
	kubeRetryMax   = 30 * time.Second
	// kubeRetryJitter keeps plugins that lost one API server together
	// from asking it again together.
	kubeRetryJitter = 0.2
	kubeProbe       = 5 * time.Second
)

// kubeRequestTimeout bounds discovery and health requests (not watches).
const kubeRequestTimeout = 10 * time.Second

// kubeOrigin is the origin of objects read from the cluster.
const kubeOrigin = "kubernetes"

// resources are the plural names of the kinds, as served.
var resources = map[string]string{
	kindServiceEntry:  "serviceentries",
	kindWorkloadEntry: "workloadentries",
}

// kubeSource watches ServiceEntry and WorkloadEntry objects through dynamic
// informers, in the API version the server prefers among those this plugin
// reads.
type kubeSource struct {
	settings *kubeSettings
	logger   hclog.Logger

	mu      sync.Mutex
	objects map[objectKey]*kubeObject
	synced  bool
	problem string
	// missing lists the kinds whose CRD the server does not serve.
	missing []string
}

// kubeObject is the last version of an object seen, and the last version
// that was accepted (served while the current one is rejected).
type kubeObject struct {
	good     *object
	rejected *decoded
}

var _ source = (*kubeSource)(nil)

func newKubeSource(s *kubeSettings, logger hclog.Logger) *kubeSource {
	return &kubeSource{settings: s, logger: logger, objects: map[objectKey]*kubeObject{}}
}

func (s *kubeSource) run(ctx context.Context, changed func()) {
	// Own connections, closed at the end, so no client goroutine outlives
	// the source.
	dialer := connrotation.NewDialer((&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
	defer dialer.CloseAll()
	cfg := rest.CopyConfig(s.settings.rest)
	cfg.Dial = dialer.DialContext
	cfg.UserAgent = "estuary-plugin-serviceentry/" + Version
	httpClient, err := rest.HTTPClientFor(cfg)
	if err == nil {
		defer httpClient.CloseIdleConnections()
	}
	var dyn dynamic.Interface
	var disc *discovery.DiscoveryClient
	if err == nil {
		dyn, err = dynamic.NewForConfigAndClient(cfg, httpClient)
	}
	if err == nil {
		disc, err = discovery.NewDiscoveryClientForConfigAndClient(cfg, httpClient)
	}
	if err != nil {
		s.setProblem(fmt.Sprintf("kubernetes %s: client: %v", cfg.Host, err), changed)
		<-ctx.Done()
		return
	}

	gvrs, ok := s.discover(ctx, disc, changed)
	if !ok {
		return
	}
	namespaces := s.settings.namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.watchHealth(ctx, disc, dyn, gvrs, namespaces, cfg.Host, changed) })

	var factories []dynamicinformer.DynamicSharedInformerFactory
	for _, ns := range namespaces {
		f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
		for _, kind := range slices.Sorted(maps.Keys(gvrs)) {
			inf := f.ForResource(gvrs[kind]).Informer()
			_ = inf.SetTransform(stripManagedFields)
			if _, err := inf.AddEventHandler(s.handler(kind, changed)); err != nil {
				s.setProblem(fmt.Sprintf("kubernetes %s: informer: %v", cfg.Host, err), changed)
			}
			_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
					return // the server closed a watch; it is re-established
				}
				s.setProblem(fmt.Sprintf("kubernetes %s: watching %s: %v", cfg.Host, resources[kind], err), changed)
			})
		}
		factories = append(factories, f)
	}
	defer func() {
		for _, f := range factories {
			f.Shutdown()
		}
	}()
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	for _, f := range factories {
		for gvr, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				s.logger.Debug("informer did not sync", "resource", gvr.String())
				return // ctx ended
			}
		}
	}
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	s.logger.Info("synced", "server", cfg.Host, "namespaces", s.settings.namespaces)
	changed()
	<-ctx.Done()
}

// discover finds the API version to watch for each kind, retrying while the
// server cannot be reached and polling while the CRDs are not installed (the
// source counts as synced, and empty, meanwhile). It returns false when ctx
// ends first.
func (s *kubeSource) discover(ctx context.Context, disc discovery.DiscoveryInterface, changed func()) (map[string]schema.GroupVersionResource, bool) {
	retry := backoff.Backoff{Base: kubeRetryFirst, Max: kubeRetryMax, Jitter: kubeRetryJitter}
	for {
		gvrs, missing, err := servedResources(ctx, disc)
		wait := crdPoll
		switch {
		case err != nil:
			s.setProblem(fmt.Sprintf("kubernetes: cannot discover %s: %v", istioGroup, err), changed)
			wait = retry.Next()
		case len(missing) > 0:
			retry.Reset()
			s.mu.Lock()
			report := !s.synced || s.problem != "" || !slices.Equal(s.missing, missing)
			s.synced, s.problem, s.missing = true, "", missing
			s.mu.Unlock()
			if report {
				s.logger.Warn("the API server does not serve Istio's CRDs; waiting for them", "missing", missing)
				changed()
			}
		default:
			s.mu.Lock()
			s.missing, s.synced = nil, false
			s.mu.Unlock()
			return gvrs, true
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-time.After(wait):
		}
	}
}

// servedResources looks up, for each kind, the first of istioVersions the
// server serves it in.
func servedResources(ctx context.Context, disc discovery.DiscoveryInterface) (gvrs map[string]schema.GroupVersionResource, missing []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, kubeRequestTimeout)
	defer cancel()
	gvrs = map[string]schema.GroupVersionResource{}
	for _, v := range istioVersions {
		var list metav1.APIResourceList
		err := disc.RESTClient().Get().AbsPath("/apis", istioGroup, v).Do(ctx).Into(&list)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		for _, r := range list.APIResources {
			for kind, plural := range resources {
				if _, have := gvrs[kind]; !have && r.Name == plural {
					gvrs[kind] = schema.GroupVersionResource{Group: istioGroup, Version: v, Resource: plural}
				}
			}
		}
	}
	for _, kind := range slices.Sorted(maps.Keys(resources)) {
		if _, ok := gvrs[kind]; !ok {
			missing = append(missing, resources[kind]+"."+istioGroup)
		}
	}
	return gvrs, missing, nil
}

// watchHealth probes the API server every kubeProbe: informers retry a
// refused connection quietly, so their error handler alone does not tell
// that the server is gone. While a problem is reported, the probe also lists
// each watched resource, so that a refused watch (RBAC) stays reported until
// the list works.
func (s *kubeSource) watchHealth(ctx context.Context, disc discovery.DiscoveryInterface, dyn dynamic.Interface,
	gvrs map[string]schema.GroupVersionResource, namespaces []string, host string, changed func()) {
	t := time.NewTicker(kubeProbe)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		deep := s.problem != ""
		s.mu.Unlock()
		if err := probe(ctx, disc, dyn, gvrs, namespaces, deep); err != nil {
			if ctx.Err() == nil {
				s.setProblem(fmt.Sprintf("kubernetes %s: %v", host, err), changed)
			}
			continue
		}
		s.setProblem("", changed)
	}
}

func probe(ctx context.Context, disc discovery.DiscoveryInterface, dyn dynamic.Interface,
	gvrs map[string]schema.GroupVersionResource, namespaces []string, deep bool) error {
	ctx, cancel := context.WithTimeout(ctx, kubeRequestTimeout)
	defer cancel()
	if err := disc.RESTClient().Get().AbsPath("/version").Do(ctx).Error(); err != nil {
		return err
	}
	if !deep {
		return nil
	}
	for _, kind := range slices.Sorted(maps.Keys(gvrs)) {
		for _, ns := range namespaces {
			if _, err := dyn.Resource(gvrs[kind]).Namespace(ns).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
				return fmt.Errorf("listing %s: %w", gvrs[kind].Resource, err)
			}
		}
	}
	return nil
}

func (s *kubeSource) setProblem(p string, changed func()) {
	s.mu.Lock()
	same := s.problem == p
	s.problem = p
	s.mu.Unlock()
	if !same {
		if p != "" {
			s.logger.Warn("source unhealthy; keeping its last objects", "error", p)
		}
		changed()
	}
}

// stripManagedFields drops managed fields, bulky and never read, before
// objects enter the informer's cache.
func stripManagedFields(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		u.SetManagedFields(nil)
	}
	return obj, nil
}

func (s *kubeSource) handler(kind string, changed func()) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.upsert(kind, obj, changed) },
		UpdateFunc: func(_, obj any) { s.upsert(kind, obj, changed) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				return
			}
			s.mu.Lock()
			delete(s.objects, objectKey{Kind: kind, Namespace: u.GetNamespace(), Name: u.GetName()})
			s.mu.Unlock()
			changed()
		},
	}
}

func (s *kubeSource) upsert(kind string, obj any, changed func()) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	if u.GetKind() == "" { // list items may come without their type
		u = u.DeepCopy()
		u.SetKind(kind)
		u.SetAPIVersion(istioGroup + "/" + istioVersions[0])
	}
	js, err := u.MarshalJSON()
	var d decoded
	if err != nil {
		d = decoded{where: kubeOrigin, key: objectKey{Kind: kind, Namespace: u.GetNamespace(), Name: u.GetName()},
			errs: fieldErrors{{msg: "cannot encode: " + err.Error()}}}
	} else {
		d = decodeJSON(js, kubeOrigin, u.GetNamespace())[0]
	}
	key := objectKey{Kind: kind, Namespace: u.GetNamespace(), Name: u.GetName()}
	s.mu.Lock()
	ko := s.objects[key]
	if ko == nil {
		ko = &kubeObject{}
		s.objects[key] = ko
	}
	if d.obj != nil {
		ko.good, ko.rejected = d.obj, nil
	} else {
		ko.rejected = &d
		s.logger.Warn("rejected object", "object", key.String(), "error", d.errs.Error())
	}
	s.mu.Unlock()
	changed()
}

func (s *kubeSource) contents() contents {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := contents{synced: s.synced, problem: s.problem}
	for _, m := range s.missing {
		c.notices = append(c.notices, sdk.Notice{Subject: "CRD " + m, Message: "not served by the API server; its objects will be read once it is installed"})
	}
	keys := slices.SortedFunc(maps.Keys(s.objects), func(a, b objectKey) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for _, k := range keys {
		ko := s.objects[k]
		if ko.good != nil {
			c.objects = append(c.objects, ko.good)
		}
		if ko.rejected != nil {
			msg := "rejected: " + ko.rejected.errs.Error()
			if ko.good != nil {
				msg += "; serving its last good version until it is fixed"
			} else {
				msg += "; skipped"
			}
			c.notices = append(c.notices, sdk.Notice{Subject: ko.rejected.subject(), Message: msg})
		}
	}
	return c
}
