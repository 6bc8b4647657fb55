package kubernetes

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
	"github.com/estuary-mesh/estuary/sdk/redact"
)

// controller runs one configuration of the plugin: the primary cluster, and
// the member clusters that Secrets labelled istio/multiCluster=true in the
// primary's secret namespace register. Each Secret data key is a cluster ID
// and its value a kubeconfig, the format `istioctl x create-remote-secret`
// writes.
type controller struct {
	opts    *options
	state   *sdk.State
	log     hclog.Logger
	primary *cluster

	secretFactory informers.SharedInformerFactory
	secretInf     cache.SharedIndexInformer
	queue         workqueue.TypedInterface[string] // secret keys, "namespace/name"

	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{} // closed when run returns
	wg       sync.WaitGroup
	stopOnce sync.Once
	gone     chan struct{} // closed when stop has torn everything down

	mu      sync.Mutex
	stopped bool
	members map[string]*member      // by cluster ID
	notices map[string][]sdk.Notice // problems of each secret, by secret key
}

// member is a cluster registered by a secret.
type member struct {
	clusterID string
	secret    string   // key of the secret that registered it
	digest    [32]byte // sha256 of the kubeconfig current runs with
	current   *cluster
	// next, during a rotation, is the cluster built from the new
	// kubeconfig, syncing before it replaces current.
	next       *cluster
	nextDigest [32]byte
}

func newController(ctx context.Context, opts *options, rc *rest.Config, state *sdk.State, log hclog.Logger) (*controller, error) {
	c := &controller{
		opts:    opts,
		state:   state,
		log:     log,
		done:    make(chan struct{}),
		gone:    make(chan struct{}),
		members: map[string]*member{},
		notices: map[string][]sdk.Notice{},
		queue:   workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{}),
	}
	c.ctx, c.cancel = context.WithCancel(ctx)
	primary, err := newCluster(clusterSpec{id: opts.clusterID, opts: opts, network: opts.network}, rc, state, log)
	if err != nil {
		return nil, err
	}
	c.primary = primary
	c.secretFactory = informers.NewSharedInformerFactoryWithOptions(primary.client, 0,
		informers.WithNamespace(opts.systemNamespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = istio.LabelMultiCluster + "=true" }))
	c.secretInf = c.secretFactory.Core().V1().Secrets().Informer()
	if err := c.secretInf.SetTransform(transformSecret); err != nil {
		return nil, err
	}
	if err := c.secretInf.SetWatchErrorHandler(primary.onWatchError); err != nil {
		return nil, err
	}
	_, err = c.secretInf.AddEventHandler(handlerFuncs(func(old, cur any) {
		obj := cur
		if obj == nil {
			obj = old
		}
		if s, ok := obj.(*corev1.Secret); ok {
			c.queue.Add(s.Namespace + "/" + s.Name)
		}
	}))
	if err != nil {
		return nil, err
	}
	return c, nil
}

// start runs the primary cluster and the secret watch. inherited names the
// instances a previous configuration reported: those the new one does not
// register again are removed once its secrets are read.
func (c *controller) start(inherited []string) {
	c.primary.start(c.ctx)
	c.primary.activate()
	c.secretFactory.Start(c.ctx.Done())
	go c.run(inherited)
}

// stop stops every cluster, waiting no longer than ctx: the teardown goes
// on, and a later stop waits for the same one. It removes no instance: a
// new configuration takes them over, or the plugin is shutting down.
func (c *controller) stop(ctx context.Context) error {
	c.stopOnce.Do(func() {
		go func() {
			defer close(c.gone)
			c.teardown()
		}()
	})
	select {
	case <-c.gone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *controller) teardown() {
	c.cancel()
	c.queue.ShutDown()
	c.secretFactory.Shutdown()
	<-c.done
	c.wg.Wait()
	c.mu.Lock()
	c.stopped = true
	members := slices.Collect(maps.Values(c.members))
	c.mu.Unlock()
	for _, m := range members {
		if m.next != nil {
			m.next.stop()
		}
		m.current.stop()
	}
	c.primary.stop()
}

// clusterIDs lists the primary's and the members' cluster IDs.
func (c *controller) clusterIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append(slices.Sorted(maps.Keys(c.members)), c.opts.clusterID)
}

func (c *controller) run(inherited []string) {
	defer close(c.done)
	err := wait.PollUntilContextCancel(c.ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		return c.secretInf.HasSynced(), nil
	})
	if err != nil {
		return
	}
	// The secrets there at start are read in name order, so that of two
	// secrets naming one cluster the same one wins on every start.
	keys := c.secretInf.GetStore().ListKeys()
	slices.Sort(keys)
	for _, k := range keys {
		c.syncSecret(k)
	}
	c.mu.Lock()
	for _, id := range inherited {
		if _, ok := c.members[id]; !ok && id != c.opts.clusterID {
			c.log.Info("cluster no longer configured; removing it", "cluster", id)
			c.state.RemoveInstance(sdk.InstanceID{Provider: sdk.ProviderKubernetes, Cluster: id})
		}
	}
	c.mu.Unlock()
	// The secret informer has synced and every remote cluster its secrets
	// name is declared (a member is declared when it is added, before its
	// own API server answers): a restarted plugin's host may now drop the
	// clusters no secret names any more. Until then it keeps them, so a
	// remote API server that is down while the plugin restarts does not
	// take the cluster's last-known endpoints with it.
	c.state.InstanceSetComplete()
	for {
		key, shutdown := c.queue.Get()
		if shutdown {
			return
		}
		c.syncSecret(key)
		c.queue.Done(key)
	}
}

// syncSecret makes the members registered by one secret match its data.
func (c *controller) syncSecret(key string) {
	var data map[string][]byte
	if obj, ok, _ := c.secretInf.GetStore().GetByKey(key); ok {
		data = obj.(*corev1.Secret).Data
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped || c.ctx.Err() != nil {
		return
	}
	released := false
	for _, id := range slices.Sorted(maps.Keys(c.members)) {
		if m := c.members[id]; m.secret == key && data[id] == nil {
			c.removeMemberLocked(m)
			released = true
		}
	}
	var notices []sdk.Notice
	for _, id := range slices.Sorted(maps.Keys(data)) {
		if n := c.syncMemberLocked(key, id, data[id]); n != "" {
			c.log.Warn("remote secret ignored", "secret", key, "key", id, "error", n)
			notices = append(notices, sdk.Notice{Subject: fmt.Sprintf("secret %s, key %q", key, id), Message: n})
		}
	}
	if len(notices) > 0 {
		c.notices[key] = notices
	} else {
		delete(c.notices, key)
	}
	var all []sdk.Notice
	for _, k := range slices.Sorted(maps.Keys(c.notices)) {
		all = append(all, c.notices[k]...)
	}
	c.primary.setExtraNotices(all)
	if released {
		// Another secret may have been waiting for a cluster ID this one held.
		for _, k := range c.secretInf.GetStore().ListKeys() {
			if k != key {
				c.queue.Add(k)
			}
		}
	}
}

// syncMemberLocked applies one data key of a secret. It returns why the
// key was ignored, or "". Caller holds c.mu.
func (c *controller) syncMemberLocked(secret, id string, kubeconfig []byte) string {
	if id == c.opts.clusterID {
		return fmt.Sprintf("cluster ID %q is the primary cluster's; ignored", id)
	}
	m := c.members[id]
	if m != nil && m.secret != secret {
		return fmt.Sprintf("cluster %q is already registered by secret %s; ignored", id, m.secret)
	}
	digest := sha256.Sum256(kubeconfig)
	if m != nil {
		switch {
		case m.next != nil && m.nextDigest == digest:
			return "" // this rotation is under way
		case m.digest == digest:
			if m.next != nil { // rotated back before the rotation finished
				m.next.stop()
				m.next = nil
				m.current.setExtraNotices(nil)
			}
			return ""
		}
	}
	rc, err := c.opts.policy.restConfig(kubeconfig)
	if err != nil {
		if m != nil {
			return fmt.Sprintf("%v; cluster %q keeps its previous kubeconfig", flatten(err), id)
		}
		return flatten(err)
	}
	spec := clusterSpec{id: id, opts: c.opts, syncTimeout: c.opts.remoteSyncTimeout}
	cl, err := newCluster(spec, rc, c.state, c.log)
	if err != nil {
		return flatten(err)
	}
	cl.start(c.ctx)
	if m == nil {
		c.log.Info("adding remote cluster", "cluster", id, "secret", secret, "server", redact.URL(rc.Host))
		c.members[id] = &member{clusterID: id, secret: secret, digest: digest, current: cl}
		cl.activate()
		return ""
	}
	c.log.Info("kubeconfig changed; syncing the new client before switching", "cluster", id, "secret", secret, "server", redact.URL(rc.Host))
	if m.next != nil {
		m.next.stop()
	}
	m.next, m.nextDigest = cl, digest
	m.current.setExtraNotices([]sdk.Notice{{
		Subject: fmt.Sprintf("secret %s, key %q", secret, id),
		Message: fmt.Sprintf("kubeconfig rotating: a client with the new kubeconfig is syncing (up to %s) before it replaces the current one", c.opts.remoteSyncTimeout),
	}})
	c.wg.Add(1)
	go c.finishRotation(m, cl)
	return ""
}

// finishRotation waits until next has synced, or remote_sync_timeout has
// passed, then stops the old client and lets next publish. The instance
// keeps its state in between: next replaces it with a snapshot once synced.
func (c *controller) finishRotation(m *member, next *cluster) {
	defer c.wg.Done()
	timer := time.NewTimer(c.opts.remoteSyncTimeout)
	defer timer.Stop()
	select {
	case <-next.synced:
	case <-timer.C:
		c.log.Warn("new kubeconfig did not sync in time; switching anyway and keeping the last-known state until it does",
			"cluster", m.clusterID, "timeout", c.opts.remoteSyncTimeout.String())
	case <-c.ctx.Done():
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped || c.ctx.Err() != nil || m.next != next {
		return // stopped, superseded or removed; whoever did it stopped next
	}
	m.current.stop()
	m.current, m.digest, m.next = next, m.nextDigest, nil
	next.takeOver()
	c.log.Info("switched to the new kubeconfig", "cluster", m.clusterID)
}

// removeMemberLocked stops a member and removes its instance, with all its
// services and endpoints, in one event. Caller holds c.mu.
func (c *controller) removeMemberLocked(m *member) {
	c.log.Info("removing remote cluster", "cluster", m.clusterID, "secret", m.secret)
	if m.next != nil {
		m.next.stop()
		m.next = nil
	}
	m.current.stop()
	delete(c.members, m.clusterID)
	c.state.RemoveInstance(m.current.id)
}

// flatten puts a joined error on one line.
func flatten(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}
