package aggregate_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/meshtest"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/replica"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// inst is one instance's content, fed to the store as a plugin would.
type inst struct {
	plugin, provider, cluster string
	scoped                    bool
	services                  []*registryv1.Service
	endpoints                 map[string][]*registryv1.Endpoint
	gateways                  []*registryv1.NetworkGateway
}

func (in *inst) id() *registryv1.InstanceID {
	return &registryv1.InstanceID{Provider: in.provider, Cluster: in.cluster}
}

func (in *inst) events() []*registryv1.Event {
	ev := func(k any) *registryv1.Event { return meshtest.Event(in.id(), k) }
	evs := []*registryv1.Event{ev(&registryv1.InstanceAdded{Properties: &registryv1.InstanceProperties{ClusterScoped: in.scoped}})}
	for _, s := range in.services {
		evs = append(evs, ev(&registryv1.ServiceUpserted{Service: s}))
	}
	for _, h := range slices.Sorted(maps.Keys(in.endpoints)) {
		evs = append(evs, ev(&registryv1.EndpointsReplaced{Hostname: h, Endpoints: in.endpoints[h]}))
	}
	if len(in.gateways) > 0 {
		evs = append(evs, ev(&registryv1.GatewaysReplaced{Gateways: in.gateways}))
	}
	return append(evs, ev(&registryv1.InstanceSynced{}))
}

// load feeds each plugin's instances to the store as one snapshot, plugins
// in the order they first appear.
func load(t *testing.T, store *replica.Store, instances ...*inst) {
	t.Helper()
	var plugins []string
	byPlugin := map[string][]*registryv1.Event{}
	for _, in := range instances {
		if _, ok := byPlugin[in.plugin]; !ok {
			plugins = append(plugins, in.plugin)
		}
		byPlugin[in.plugin] = append(byPlugin[in.plugin], in.events()...)
	}
	for _, p := range plugins {
		resp := &registryv1.WatchResponse{Sequence: 1, Snapshot: true, SnapshotDone: true, Events: byPlugin[p]}
		if err := store.NewSession(p).Apply(resp); err != nil {
			t.Fatalf("plugin %s: %v", p, err)
		}
	}
}

func service(host, ns string, vips map[string][]string, ports ...*registryv1.Port) *registryv1.Service {
	s := &registryv1.Service{Hostname: host, Namespace: ns, Ports: ports}
	for _, c := range slices.Sorted(maps.Keys(vips)) {
		s.Vips = append(s.Vips, &registryv1.ClusterAddresses{Cluster: c, Addresses: vips[c]})
	}
	return s
}

func port(name string, n uint32) *registryv1.Port {
	return &registryv1.Port{Name: name, Number: n, Protocol: "HTTP"}
}

func ep(addr string, labels map[string]string, targets map[string]uint32) *registryv1.Endpoint {
	return &registryv1.Endpoint{Address: addr, Labels: labels, TargetPorts: targets}
}

const echo = "echo.default.svc.cluster.local"

// kube returns a cluster-scoped instance of the kubernetes plugin holding
// echo with one VIP and the given endpoints.
func kube(cluster, vip string, ports []*registryv1.Port, eps ...*registryv1.Endpoint) *inst {
	return &inst{
		plugin: "kubernetes", provider: "Kubernetes", cluster: cluster, scoped: true,
		services:  []*registryv1.Service{service(echo, "default", map[string][]string{cluster: {vip}}, ports...)},
		endpoints: map[string][]*registryv1.Endpoint{echo: eps},
	}
}

// endpointAddrs lists a service port's endpoints over every instance, in
// order, as ADDR:TARGETPORT@CLUSTER.
func endpointAddrs(agg *aggregate.Registry, host string, port uint32) string {
	svc := agg.GetService(host)
	if svc == nil {
		return ""
	}
	i := slices.IndexFunc(svc.Ports, func(p sdk.Port) bool { return p.Number == port })
	if i < 0 {
		return ""
	}
	var out []string
	for _, src := range agg.EndpointSources(host) {
		for j := range src.Set.Endpoints {
			e := &src.Set.Endpoints[j]
			out = append(out, fmt.Sprintf("%s:%d@%s", e.Address, e.TargetPort(svc.Ports[i]), src.Instance.Key.Cluster))
		}
	}
	return strings.Join(out, " ")
}

// merged is what a merged service should look like.
type merged struct {
	namespace string
	ports     []sdk.Port
	vips      map[string][]string
	instances []string // clusters, in order
	conflicts []string // "field: winner -> loser: detail"
	endpoints string
	mtls      sdk.MTLSMode
}

func TestMerge(t *testing.T) {
	http := []*registryv1.Port{port("http", 80)}
	tests := []struct {
		name      string
		instances []*inst
		order     []string // plugin order; nil keeps first-seen
		want      *merged
	}{{
		name: "same host in two clusters",
		instances: []*inst{
			kube("c1", "10.96.0.10", http, ep("10.0.0.1", nil, nil)),
			kube("c2", "10.97.0.10", http, ep("10.1.0.1", nil, nil), ep("10.1.0.2", nil, nil)),
		},
		want: &merged{
			namespace: "default",
			ports:     []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}},
			vips:      map[string][]string{"c1": {"10.96.0.10"}, "c2": {"10.97.0.10"}},
			instances: []string{"c1", "c2"},
			endpoints: "10.0.0.1:80@c1 10.1.0.1:80@c2 10.1.0.2:80@c2",
		},
	}, {
		name: "same VIP twice is kept once",
		instances: []*inst{
			kube("c1", "10.96.0.10", http),
			{plugin: "static", provider: "Static", cluster: "c1",
				services: []*registryv1.Service{service(echo, "default", map[string][]string{"c1": {"10.96.0.10", "10.96.0.11"}}, http...)}},
		},
		want: &merged{
			namespace: "default",
			ports:     []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}},
			vips:      map[string][]string{"c1": {"10.96.0.10", "10.96.0.11"}},
			instances: []string{"c1", "c1"},
		},
	}, {
		name: "first instance's attributes win",
		instances: []*inst{
			kube("c1", "10.96.0.10", []*registryv1.Port{port("http", 80)}, ep("10.0.0.1", nil, nil)),
			{plugin: "consul", provider: "Consul", cluster: "dc1",
				services:  []*registryv1.Service{service(echo, "consul", nil, port("http", 8080))},
				endpoints: map[string][]*registryv1.Endpoint{echo: {ep("10.2.0.1", nil, nil)}}},
		},
		want: &merged{
			namespace: "default",
			ports:     []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}},
			vips:      map[string][]string{"c1": {"10.96.0.10"}},
			instances: []string{"c1", "dc1"},
			conflicts: []string{
				"ports: kubernetes:Kubernetes/c1 -> consul:Consul/dc1: [{http 80 HTTP}] kept, [{http 8080 HTTP}] ignored",
				`namespace: kubernetes:Kubernetes/c1 -> consul:Consul/dc1: "default" kept, "consul" ignored`,
			},
			// The loser's endpoints still serve, on the winner's port.
			endpoints: "10.0.0.1:80@c1 10.2.0.1:80@dc1",
		},
	}, {
		name: "plugin order, not arrival, decides the winner",
		instances: []*inst{
			kube("c1", "10.96.0.10", []*registryv1.Port{port("http", 80)}),
			{plugin: "consul", provider: "Consul", cluster: "dc1",
				services: []*registryv1.Service{service(echo, "default", nil, port("http", 8080))}},
		},
		order: []string{"consul", "kubernetes"},
		want: &merged{
			namespace: "default",
			ports:     []sdk.Port{{Name: "http", Number: 8080, Protocol: "HTTP"}},
			vips:      map[string][]string{"c1": {"10.96.0.10"}},
			instances: []string{"dc1", "c1"},
			conflicts: []string{"ports: consul:Consul/dc1 -> kubernetes:Kubernetes/c1: [{http 8080 HTTP}] kept, [{http 80 HTTP}] ignored"},
		},
	}, {
		name: "the winner's mTLS mode applies to the merged service",
		instances: []*inst{
			{plugin: "static", provider: "Static", cluster: "s",
				services: []*registryv1.Service{func() *registryv1.Service {
					s := service(echo, "default", nil, http...)
					s.MtlsMode, s.MtlsModeSource = registryv1.MTLSMode_MTLS_MODE_STRICT, "attribute mtls_mode"
					return s
				}()}},
			kube("c1", "10.96.0.10", http),
		},
		want: &merged{
			namespace: "default",
			ports:     []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}},
			vips:      map[string][]string{"c1": {"10.96.0.10"}},
			instances: []string{"s", "c1"},
			mtls:      sdk.MTLSModeStrict,
			conflicts: []string{`mtls_mode: static:Static/s -> kubernetes:Kubernetes/c1: "STRICT" kept, "" ignored`},
		},
	}, {
		name:      "unknown host",
		instances: []*inst{kube("c1", "10.96.0.10", http)},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := replica.NewStore(nil)
			agg := aggregate.New(store, nil)
			load(t, store, tt.instances...)
			if tt.order != nil {
				store.SetPluginOrder(tt.order)
			}
			host := echo
			if tt.want == nil {
				host = "nope.example.com"
			}
			got := agg.GetService(host)
			if tt.want == nil {
				if got != nil {
					t.Errorf("GetService = %+v, want nil", got)
				}
				return
			}
			if got == nil {
				t.Fatalf("GetService(%s) = nil", host)
			}
			w := tt.want
			if got.Namespace != w.namespace || !slices.Equal(got.Ports, w.ports) {
				t.Errorf("namespace %q ports %v; want %q %v", got.Namespace, got.Ports, w.namespace, w.ports)
			}
			if got.MTLSMode != w.mtls {
				t.Errorf("mTLS mode %q, want %q", got.MTLSMode, w.mtls)
			}
			if !maps.EqualFunc(got.VIPs, w.vips, slices.Equal) {
				t.Errorf("VIPs = %v, want %v", got.VIPs, w.vips)
			}
			var clusters []string
			for _, k := range got.Instances {
				clusters = append(clusters, k.Cluster)
			}
			if !slices.Equal(clusters, w.instances) {
				t.Errorf("instances = %v, want %v", clusters, w.instances)
			}
			var conflicts []string
			for _, c := range got.Conflicts {
				if c.Hostname != echo {
					t.Errorf("conflict hostname %q", c.Hostname)
				}
				conflicts = append(conflicts, fmt.Sprintf("%s: %s -> %s: %s", c.Field, c.Winner, c.Loser, c.Detail))
			}
			if !slices.Equal(conflicts, w.conflicts) {
				t.Errorf("conflicts:\n got %q\nwant %q", conflicts, w.conflicts)
			}
			if e := endpointAddrs(agg, echo, w.ports[0].Number); e != w.endpoints {
				t.Errorf("endpoints = %q, want %q", e, w.endpoints)
			}
			// Services() agrees with GetService.
			all := agg.Services()
			if len(all) != 1 || all[0].Hostname != echo || !maps.EqualFunc(all[0].VIPs, w.vips, slices.Equal) {
				t.Errorf("Services() = %+v", all)
			}
			// The merge never writes into the instance's own service.
			for _, in := range store.Instances() {
				if s := in.Service(echo); s != nil && len(s.VIPs) > 1 {
					t.Errorf("instance %s's service VIPs changed by the merge: %v", in.Key, s.VIPs)
				}
			}
		})
	}
}

// TestUnmerge checks that an instance leaving takes its VIPs and endpoints
// with it, even though the merged service was cached.
func TestUnmerge(t *testing.T) {
	http := []*registryv1.Port{port("http", 80)}
	store := replica.NewStore(nil)
	agg := aggregate.New(store, nil)
	var pushes []model.Change
	agg.Subscribe(func(c model.Change) { pushes = append(pushes, c) })
	c1 := kube("c1", "10.96.0.10", http, ep("10.0.0.1", nil, nil))
	c2 := kube("c2", "10.97.0.10", http, ep("10.1.0.1", nil, nil))
	sess := store.NewSession("kubernetes")
	evs := append(c1.events(), c2.events()...)
	if err := sess.Apply(&registryv1.WatchResponse{Sequence: 1, Snapshot: true, SnapshotDone: true, Events: evs}); err != nil {
		t.Fatal(err)
	}
	if s := agg.GetService(echo); s == nil || len(s.VIPs) != 2 {
		t.Fatalf("merged service = %+v, want VIPs of two clusters", s)
	}
	if e := endpointAddrs(agg, echo, 80); e != "10.0.0.1:80@c1 10.1.0.1:80@c2" {
		t.Fatalf("endpoints = %s", e)
	}
	pushes = nil

	err := sess.Apply(&registryv1.WatchResponse{Sequence: 2, Events: []*registryv1.Event{
		{Instance: c2.id(), Kind: &registryv1.Event_InstanceRemoved{InstanceRemoved: &registryv1.InstanceRemoved{}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	s := agg.GetService(echo)
	if s == nil || !maps.EqualFunc(s.VIPs, map[string][]string{"c1": {"10.96.0.10"}}, slices.Equal) || len(s.Instances) != 1 {
		t.Errorf("after c2 left: service = %+v, want only c1's VIP", s)
	}
	if e := endpointAddrs(agg, echo, 80); e != "10.0.0.1:80@c1" {
		t.Errorf("after c2 left: endpoints = %s", e)
	}
	if len(pushes) != 1 || !pushes[0].Full {
		t.Errorf("aggregate subscribers got %+v, want one Full change", pushes)
	}

	// c1 changes its VIP through a service upsert: the cache must follow.
	upd := service(echo, "default", map[string][]string{"c1": {"10.96.0.99"}}, http...)
	err = sess.Apply(&registryv1.WatchResponse{Sequence: 3, Events: []*registryv1.Event{
		{Instance: c1.id(), Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: upd}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if s := agg.GetService(echo); s == nil || !slices.Equal(s.VIPs["c1"], []string{"10.96.0.99"}) {
		t.Errorf("after upsert: service = %+v, want VIP 10.96.0.99", s)
	}

	// The last instance leaves: the service is gone.
	err = sess.Apply(&registryv1.WatchResponse{Sequence: 4, Events: []*registryv1.Event{
		{Instance: c1.id(), Kind: &registryv1.Event_ServiceDeleted{ServiceDeleted: &registryv1.ServiceDeleted{Hostname: echo}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if s := agg.GetService(echo); s != nil {
		t.Errorf("after delete: service = %+v, want nil", s)
	}
	if got := agg.Services(); len(got) != 0 {
		t.Errorf("after delete: Services() = %d", len(got))
	}
}

// TestEndpointTargetPorts: each endpoint serves a service port on its own
// target port when it names one, else on the service port.
func TestEndpointTargetPorts(t *testing.T) {
	store := replica.NewStore(nil)
	agg := aggregate.New(store, nil)
	v1 := map[string]string{"app": "echo", "version": "v1"}
	v2 := map[string]string{"app": "echo", "version": "v2"}
	load(t, store,
		&inst{plugin: "static", provider: "Static", cluster: "c1",
			services: []*registryv1.Service{service(echo, "default", nil, port("http", 80), port("grpc", 9090))},
			endpoints: map[string][]*registryv1.Endpoint{echo: {
				ep("10.0.0.1", v1, map[string]uint32{"http": 8080}),
				ep("10.0.0.2", v2, map[string]uint32{"http": 8081, "grpc": 50051}),
				ep("10.0.0.3", v1, nil),
				ep("10.0.0.4", nil, nil),
			}}},
		&inst{plugin: "static2", provider: "Static", cluster: "c2",
			services:  []*registryv1.Service{service(echo, "default", nil, port("http", 80), port("grpc", 9090))},
			endpoints: map[string][]*registryv1.Endpoint{echo: {ep("10.1.0.1", v2, map[string]uint32{"grpc": 50052})}}},
	)
	tests := []struct {
		name string
		host string
		port uint32
		want string
	}{
		{"all, target ports mapped", echo, 80, "10.0.0.1:8080@c1 10.0.0.2:8081@c1 10.0.0.3:80@c1 10.0.0.4:80@c1 10.1.0.1:80@c2"},
		{"other port", echo, 9090, "10.0.0.1:9090@c1 10.0.0.2:50051@c1 10.0.0.3:9090@c1 10.0.0.4:9090@c1 10.1.0.1:50052@c2"},
		{"port the service lacks", echo, 8080, ""},
		{"unknown host", "nope.example.com", 80, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := endpointAddrs(agg, tt.host, tt.port); got != tt.want {
				t.Errorf("Endpoints:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestNetworkGateways(t *testing.T) {
	store := replica.NewStore(nil)
	agg := aggregate.New(store, nil)
	gw := func(network, addr string) *registryv1.NetworkGateway {
		return &registryv1.NetworkGateway{Network: network, Cluster: "c1", Address: addr, Port: 15443}
	}
	load(t, store,
		&inst{plugin: "kubernetes", provider: "Kubernetes", cluster: "c1", gateways: []*registryv1.NetworkGateway{gw("n1", "1.1.1.1"), gw("n1", "1.1.1.2")}},
		&inst{plugin: "static", provider: "Static", cluster: "c1", gateways: []*registryv1.NetworkGateway{gw("n1", "1.1.1.2"), gw("n2", "2.2.2.2")}},
	)
	var got []string
	for _, g := range agg.NetworkGateways() {
		got = append(got, g.Network+"@"+g.Address)
	}
	if want := []string{"n1@1.1.1.1", "n1@1.1.1.2", "n2@2.2.2.2"}; !slices.Equal(got, want) {
		t.Errorf("NetworkGateways = %v, want %v", got, want)
	}
}
