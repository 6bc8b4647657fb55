// Package consul is the Consul service registry: it streams a Consul
// catalog into Estuary with blocking queries, one instance per datacenter
// (Provider "Consul", Cluster = the datacenter's name).
//
// Each datacenter runs one blocking query on the catalog's service list and
// one per service on its health (/v1/health/service/NAME), all sharing one
// HTTP client; a change in Consul wakes exactly the query that depends on
// it, so nothing polls. Consul's index rules are followed: an index that
// goes backwards resets to 0 and lists afresh, an index of 0 becomes 1, an
// answer equal to the last one emits nothing, and every loop is
// rate-limited. Failed requests back off with jitter and keep the
// last-known state; the instance's health says what failed.
//
// See README.md for the config block and how Consul data becomes services,
// endpoints and gateways.
package consul

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/redact"
)

// Version of the plugin.
const Version = "0.1.0"

// Factory builds the plugin.
func Factory(rt sdk.Runtime) sdk.Plugin {
	return &plugin{
		rt: rt, log: rt.Logger.With("provider", sdk.ProviderConsul),
		turn: semaphore.NewWeighted(1), held: map[sdk.InstanceID]map[string]bool{},
	}
}

type plugin struct {
	rt  sdk.Runtime
	log hclog.Logger

	// turn admits one Configure (or Stop) at a time. Unlike a mutex, a
	// caller waiting for it gives up when its context ends, so a run that
	// is slow to stop never blocks a call beyond the host's deadline.
	turn *semaphore.Weighted
	cur  *run // the last started run, maybe stopping; nil before the first Configure

	heldMu sync.Mutex
	// held lists, per instance, the hostnames it holds in State. It outlives
	// a run, so a new config can remove what the old one reported.
	held map[sdk.InstanceID]map[string]bool
}

var (
	_ sdk.Plugin  = (*plugin)(nil)
	_ sdk.Stopper = (*plugin)(nil)
)

func (p *plugin) Describe(context.Context, *sdk.DescribeRequest) (*sdk.DescribeResponse, error) {
	return &sdk.DescribeResponse{
		Name:    "consul",
		Version: Version,
		Capabilities: []sdk.Capability{
			sdk.CapabilityReconfigure, sdk.CapabilityMultiInstance, sdk.CapabilityGateways,
			// Without configured datacenters, the agent names them.
			sdk.CapabilityInstanceSet,
		},
		ConfigSchema: schema,
	}, nil
}

// Configure starts watching with a new config. The running watches stop
// first (State keeps serving what they reported meanwhile); if they have
// not stopped when ctx ends, Configure returns ctx's error and the next
// call waits for them again.
func (p *plugin) Configure(ctx context.Context, req *sdk.ConfigureRequest) (*sdk.ConfigureResponse, error) {
	var cfg config
	if err := req.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("consul: decode config: %w", err)
	}
	s, diags := parseConfig(&cfg, req.Mesh)
	if diags.HasErrors() {
		return &sdk.ConfigureResponse{Diagnostics: diags}, nil
	}
	if err := p.turn.Acquire(ctx, 1); err != nil {
		return nil, fmt.Errorf("consul: configure: %w", err)
	}
	defer p.turn.Release(1)
	if err := p.rt.Context.Err(); err != nil {
		return nil, fmt.Errorf("consul: configure: %w", err)
	}
	// A host reload re-sends every plugin's block. The same block, with the
	// same token and no TLS files to re-read, keeps the running watches
	// instead of listing everything again.
	if c := p.cur; c != nil && c.ctx.Err() == nil && bytes.Equal(c.raw, req.ConfigJSON) && c.mesh.Equal(req.Mesh) && c.s.token == s.token && s.tls == nil {
		return &sdk.ConfigureResponse{Diagnostics: diags}, nil
	}
	client, tr, err := newClient(s)
	if err != nil {
		diags.Errorf([]string{"address"}, "consul client: %v", err)
		return &sdk.ConfigureResponse{Diagnostics: diags}, nil
	}
	if p.cur != nil {
		// The old watches stop before the new ones start, as both share
		// the instances' held hostnames; State keeps serving what they
		// reported meanwhile.
		if err := p.cur.group.Stop(ctx); err != nil {
			tr.CloseIdleConnections()
			return nil, fmt.Errorf("consul: configure: stop the previous config's watches: %w", err)
		}
	}
	p.cur = p.start(s, client, tr)
	p.cur.raw, p.cur.mesh = bytes.Clone(req.ConfigJSON), req.Mesh
	p.log.Info("configured", "address", redact.URL(s.api.Address), "scheme", s.api.Scheme, "datacenters", s.datacenters,
		"wait_time", s.waitTime, "health", map[bool]string{false: healthPassing, true: healthWarning}[s.warning],
		"tag_filter", s.tagFilter, "max_watchers", s.maxWatchers, "rate_limit", s.rateLimit, "token_set", s.token != "")
	return &sdk.ConfigureResponse{Diagnostics: diags}, nil
}

// newClient builds the one HTTP client all watches of a config share. It
// keeps an idle connection for every watch, so blocking queries reuse their
// connections instead of opening one per request.
func newClient(s *settings) (*api.Client, *http.Transport, error) {
	conns := s.maxWatchers*max(1, len(s.datacenters))*max(1, len(s.namespaces))*max(1, len(s.partitions)) + 8
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          conns,
		MaxIdleConnsPerHost:   conns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		// Consul is meant to be asked through a nearby agent: gzip would
		// cost it more CPU than the bytes save (the benchmark syncs about
		// twice as fast without it).
		DisableCompression: true,
	}
	if s.tls != nil {
		tr.TLSClientConfig = s.tls
		// Over TLS the agent speaks HTTP/2, which multiplexes many blocking
		// queries on one connection.
		tr.ForceAttemptHTTP2 = true
	}
	cfg := s.api // copy
	cfg.Token = s.token
	cfg.HttpClient = &http.Client{Transport: tr}
	client, err := api.NewClient(&cfg)
	if err != nil {
		return nil, nil, err
	}
	return client, tr, nil
}

// run is one config at work: its client, limits and datacenters.
type run struct {
	p      *plugin
	s      *settings
	raw    []byte // the config block it runs, to spot an unchanged reload
	mesh   sdk.MeshSettings
	client *api.Client
	tr     *http.Transport
	// token is the ACL token sent with every request; a token file is
	// re-read when Consul answers 403.
	token   atomic.Pointer[string]
	limiter *rate.Limiter // shared by every loop of the run

	group *sdk.Run        // runs main, which waits for the loops it starts
	ctx   context.Context // the group's
	wg    sync.WaitGroup  // the datacenters' and services' loops
}

func (p *plugin) start(s *settings, client *api.Client, tr *http.Transport) *run {
	group := sdk.StartRun(p.rt.Context)
	r := &run{
		p: p, s: s, client: client, tr: tr,
		limiter: rate.NewLimiter(rate.Limit(s.rateLimit), max(1, int(s.rateLimit))),
		group:   group, ctx: group.Context(),
	}
	r.token.Store(&s.token)
	group.Go(r.main)
	return r
}

// Stop waits for the running watches to end; the SDK calls it once the
// plugin's context has ended.
func (p *plugin) Stop(ctx context.Context) error {
	if err := p.turn.Acquire(ctx, 1); err != nil {
		return fmt.Errorf("consul: stop: %w", err)
	}
	defer p.turn.Release(1)
	if p.cur != nil {
		return p.cur.group.Stop(ctx)
	}
	return nil
}

func (r *run) main(context.Context) {
	defer r.tr.CloseIdleConnections()
	defer r.wg.Wait()
	dcs := r.s.datacenters
	if len(dcs) == 0 {
		dc, ok := r.ownDatacenter()
		if !ok {
			return
		}
		dcs = []string{dc}
	}
	peers, ok := r.peers(dcs)
	if !ok {
		return
	}
	scopes, ok := r.scopes()
	if !ok {
		return
	}
	r.p.retain(append(slices.Clone(dcs), peers...))
	for i, name := range slices.Concat(dcs, peers) {
		d := r.newDatacenter(name, i >= len(dcs), scopes)
		for _, sc := range d.scopes {
			r.wg.Go(func() { d.watchCatalog(r.ctx, sc) })
		}
	}
	// Every datacenter is declared (newDatacenter did it): only now may a
	// restarted plugin's host drop the ones not declared again. Until then
	// an agent that is down keeps the last-known services served.
	r.p.rt.State.InstanceSetComplete()
	<-r.ctx.Done()
}

// peers are the cluster peers to watch: those of the config and, with
// "*", every peering the agent lists, retrying until it answers or the
// run ends. A listed peering whose name is a watched datacenter's is
// skipped, with a warning: both would be the instance of that cluster.
// A peering being deleted or terminated exports nothing any more.
func (r *run) peers(dcs []string) ([]string, bool) {
	peers := slices.Clone(r.s.peers)
	if !r.s.allPeers {
		return peers, true
	}
	var list []*api.Peering
	ok := r.retry(fmt.Sprintf("cannot list the peerings of %s (peers = [\"*\"])", r.s.api.Address), func(ctx context.Context) error {
		q := r.query(ctx, 0)
		r.s.peerScope().apply(q)
		var err error
		list, _, err = r.client.Peerings().List(ctx, q)
		return err
	})
	if !ok {
		return nil, false
	}
	for _, p := range list {
		switch {
		case p.State == api.PeeringStateDeleting || p.State == api.PeeringStateTerminated || slices.Contains(peers, p.Name):
		case slices.Contains(dcs, p.Name):
			r.p.log.Warn("peering has the name of a watched datacenter; not watched", "cluster", p.Name)
		default:
			peers = append(peers, p.Name)
		}
	}
	slices.Sort(peers)
	return peers, true
}

// retry runs one request of the run's setup until it succeeds or the run
// ends, backing off between tries. While it fails, the plugin's health
// says what (no instance exists yet to say it), prefixed by what.
func (r *run) retry(what string, do func(ctx context.Context) error) bool {
	bo := newBackoff()
	last := ""
	for {
		if err := r.limiter.Wait(r.ctx); err != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
		err := do(ctx)
		cancel()
		if r.ctx.Err() != nil {
			return false
		}
		if err == nil {
			if last != "" {
				r.p.rt.State.SetPluginHealth(sdk.InstanceHealth{Healthy: true})
			}
			return true
		}
		err = r.explain(r.ctx, err)
		if msg := describe(err); msg != last {
			r.p.log.Error(what, "error", msg)
			r.p.rt.State.SetPluginHealth(sdk.InstanceHealth{Message: what + ": " + msg})
			last = msg
		}
		r.reloadToken(err)
		if bo.Wait(r.ctx) != nil {
			return false
		}
	}
}

// retain removes the instances of datacenters the config no longer lists.
func (p *plugin) retain(dcs []string) {
	p.heldMu.Lock()
	defer p.heldMu.Unlock()
	for _, id := range slices.SortedFunc(maps.Keys(p.held), func(a, b sdk.InstanceID) int { return strings.Compare(a.Cluster, b.Cluster) }) {
		if !slices.Contains(dcs, id.Cluster) {
			p.rt.State.RemoveInstance(id)
			delete(p.held, id)
			p.log.Info("datacenter no longer configured; instance removed", "cluster", id.Cluster)
		}
	}
}

// heldFor returns the held-hostname set of an instance, creating it.
func (p *plugin) heldFor(id sdk.InstanceID) map[string]bool {
	p.heldMu.Lock()
	defer p.heldMu.Unlock()
	h := p.held[id]
	if h == nil {
		h = map[string]bool{}
		p.held[id] = h
	}
	return h
}

// ownDatacenter asks the agent for its datacenter, retrying until it
// answers or the run ends. /v1/agent/self needs agent:read; without it, a
// catalog that knows a single datacenter answers too.
func (r *run) ownDatacenter() (string, bool) {
	bo := newBackoff()
	last := ""
	for {
		if err := r.limiter.Wait(r.ctx); err != nil {
			return "", false
		}
		dc, err := r.queryOwnDatacenter()
		if r.ctx.Err() != nil {
			return "", false
		}
		if err == nil {
			r.p.rt.State.SetPluginHealth(sdk.InstanceHealth{Healthy: true})
			return dc, true
		}
		err = r.explain(r.ctx, err)
		if msg := describe(err); msg != last {
			r.p.log.Error("cannot learn the agent's datacenter; set datacenters to skip this step", "error", msg)
			// No datacenter is known, so no instance can say it: the
			// plugin does, and the host shows it until the agent answers.
			r.p.rt.State.SetPluginHealth(sdk.InstanceHealth{Message: fmt.Sprintf(
				"Consul never reached: cannot learn the agent's datacenter from %s (set datacenters to skip this step): %s", r.s.api.Address, msg)})
			last = msg
		}
		r.reloadToken(err)
		if bo.Wait(r.ctx) != nil {
			return "", false
		}
	}
}

func (r *run) queryOwnDatacenter() (string, error) {
	ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
	defer cancel()
	var self struct{ Config struct{ Datacenter string } }
	_, err := r.client.Raw().Query("/v1/agent/self", &self, r.query(ctx, 0))
	if err == nil && self.Config.Datacenter != "" {
		return self.Config.Datacenter, nil
	}
	var dcs []string
	if _, derr := r.client.Raw().Query("/v1/catalog/datacenters", &dcs, r.query(ctx, 0)); derr == nil && len(dcs) == 1 {
		return dcs[0], nil
	}
	if err == nil {
		err = errors.New("agent/self names no datacenter")
	}
	return "", fmt.Errorf("agent's datacenter: %w", err)
}

// query returns the options of a request waiting on index (0: answer at
// once).
func (r *run) query(ctx context.Context, index uint64) *api.QueryOptions {
	q := &api.QueryOptions{
		WaitIndex: index,
		WaitTime:  r.s.waitTime,
		Token:     *r.token.Load(),
	}
	return q.WithContext(ctx)
}

// requestTimeout bounds one request: the wait, Consul's jitter of up to
// wait/16, and slack for a slow answer.
func (r *run) requestTimeout() time.Duration {
	return r.s.waitTime + r.s.waitTime/16 + 30*time.Second
}

// reloadToken re-reads the token file after a 403, so a rotated token is
// picked up without a reconfigure.
func (r *run) reloadToken(err error) {
	if r.s.tokenFile == "" || statusCode(err) != http.StatusForbidden {
		return
	}
	tok, rerr := readToken(r.s.tokenFile)
	if rerr != nil {
		r.p.log.Warn("cannot re-read the token file", "error", rerr)
		return
	}
	if tok != *r.token.Load() {
		r.token.Store(&tok)
		r.p.log.Info("token file changed; using the new token", "token_file", r.s.tokenFile)
	}
}

// keys returns the sorted keys of a set.
func keys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
