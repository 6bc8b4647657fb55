package xds_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2/hclparse"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/host/network"
	"github.com/estuary-mesh/estuary/host/pipeline"
	"github.com/estuary-mesh/estuary/host/replica"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/xds"
)

// gwMesh is a replica with two instances, fed as plugins feed it.
type gwMesh struct {
	t     *testing.T
	store *replica.Store
	agg   *aggregate.Registry
	sess  map[string]*replica.Session
	seq   map[string]uint64
}

func newGWMesh(t *testing.T) *gwMesh {
	store := replica.NewStore(nil)
	return &gwMesh{t: t, store: store, agg: aggregate.New(store, nil), sess: map[string]*replica.Session{}, seq: map[string]uint64{}}
}

func (m *gwMesh) apply(cluster string, evs ...*registryv1.Event) {
	m.t.Helper()
	id := &registryv1.InstanceID{Provider: "Static", Cluster: cluster}
	for _, ev := range evs {
		ev.Instance = id
	}
	sess := m.sess[cluster]
	first := sess == nil
	if first {
		sess = m.store.NewSession("plugin-" + cluster)
		m.sess[cluster] = sess
	}
	m.seq[cluster]++
	if err := sess.Apply(&registryv1.WatchResponse{Sequence: m.seq[cluster], Snapshot: first, SnapshotDone: first, Events: evs}); err != nil {
		m.t.Fatal(err)
	}
}

func gwAdded(defaultNetwork string) *registryv1.Event {
	return &registryv1.Event{Kind: &registryv1.Event_InstanceAdded{InstanceAdded: &registryv1.InstanceAdded{
		Properties: &registryv1.InstanceProperties{DefaultNetwork: defaultNetwork}}}}
}

func gwSynced() *registryv1.Event {
	return &registryv1.Event{Kind: &registryv1.Event_InstanceSynced{InstanceSynced: &registryv1.InstanceSynced{}}}
}

func gwService(host string, res registryv1.Resolution, ports ...uint32) *registryv1.Event {
	svc := &registryv1.Service{Hostname: host, Namespace: "default", Resolution: res}
	for _, p := range ports {
		svc.Ports = append(svc.Ports, &registryv1.Port{Name: fmt.Sprintf("p%d", p), Number: p, Protocol: "GRPC"})
	}
	return &registryv1.Event{Kind: &registryv1.Event_ServiceUpserted{ServiceUpserted: &registryv1.ServiceUpserted{Service: svc}}}
}

func gwEndpoints(host string, eps ...*registryv1.Endpoint) *registryv1.Event {
	return &registryv1.Event{Kind: &registryv1.Event_EndpointsReplaced{EndpointsReplaced: &registryv1.EndpointsReplaced{Hostname: host, Endpoints: eps}}}
}

func gwEP(addr, network, version string, mtls bool) *registryv1.Endpoint {
	e := &registryv1.Endpoint{Address: addr, Network: network, Locality: "us-east1/us-east1-b", TargetPorts: map[string]uint32{"p8080": 18080}}
	if version != "" {
		e.Labels = map[string]string{model.SubsetLabel: version}
	}
	if mtls {
		e.TlsMode = registryv1.TLSMode_TLS_MODE_ISTIO
	}
	return e
}

// gwNetworks places the endpoints of cluster2, which carry no network and
// whose registry has no default, on network2, by from_registry.
func gwNetworks(t *testing.T, agg *aggregate.Registry) *network.Manager {
	f, diags := hclparse.NewParser().ParseHCL([]byte(`network "network2" {
  endpoints { from_registry = "cluster2" }
}
`), "plugins.hcl")
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	cfg, diags := network.Decode(f.Body, "plugins.hcl")
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	m := network.New(agg, hclog.NewNullLogger(), network.Options{ResolvConf: "/nonexistent"})
	m.Apply(cfg)
	return m
}

const (
	gwEcho = "echo.default.svc.cluster.local"
	gwDB   = "db.example.com"
)

func setupGatewayMesh(t *testing.T) *gwMesh {
	m := newGWMesh(t)
	m.apply("cluster1", gwAdded("network1"),
		gwService(gwEcho, registryv1.Resolution_RESOLUTION_STATIC, 8080, 9090),
		gwEndpoints(gwEcho,
			gwEP("10.1.0.1", "", "v1", true),         // local (registry default), mTLS
			gwEP("10.1.0.2", "", "v2", true),         // local, mTLS
			gwEP("10.1.0.3", "", "v1", false),        // local, plain text: not through a gateway
			gwEP("10.9.0.1", "network9", "", true),   // another network
			gwEP("10.0.0.7", "network1", "v2", true), // its own label says network1
		),
		gwService(gwDB, registryv1.Resolution_RESOLUTION_DNS, 5432),
		gwSynced())
	m.apply("cluster2", gwAdded(""),
		gwService(gwEcho, registryv1.Resolution_RESOLUTION_STATIC, 8080, 9090),
		gwEndpoints(gwEcho, gwEP("10.2.0.1", "", "v1", true)), // network2 by from_registry
		gwSynced())
	return m
}

// routerView is what an east-west gateway of network1 presents.
func routerView(t *testing.T) model.View {
	md, err := structpb.NewStruct(map[string]any{"NETWORK": "network1", "REQUESTED_NETWORK_VIEW": "network1", "CLUSTER_ID": "cluster1"})
	if err != nil {
		t.Fatal(err)
	}
	n := xds.ParseNode(&corev3.Node{Id: "router~10.1.0.100~istio-eastwestgateway-1.istio-system~istio-system.svc.cluster.local", Metadata: md})
	v := n.View()
	if v.Kind != model.KindRouter || v.Network != "network1" || v.Networks != "network1" {
		t.Fatalf("router node view = %+v", v)
	}
	return v
}

func sniNames(host string, ports ...uint32) []string {
	var out []string
	for _, p := range ports {
		for _, s := range []string{"", "v1", "v2"} {
			out = append(out, fmt.Sprintf("outbound_.%d_.%s_.%s", p, s, host))
		}
	}
	return out
}

// TestGatewayConfig: an east-west gateway gets the SNI listener on 15443,
// one EDS cluster per service port and subset, and in those clusters only
// its own network's mTLS endpoints.
func TestGatewayConfig(t *testing.T) {
	m := setupGatewayMesh(t)
	c := xds.NewCache(xds.NewGenerator(m.agg, pipeline.New(m.agg, gwNetworks(t, m.agg), nil)))
	v := routerView(t)
	wantNames := sniNames(gwEcho, 8080, 9090)

	// LDS: one listener, TLS inspector, a chain per SNI name to its cluster.
	ls := c.Resources(v, resourcev3.ListenerType)
	if len(ls) != 1 || ls[0].Name != xds.GatewayListenerName {
		t.Fatalf("router listeners = %v", resourceNames(ls))
	}
	l := &listenerv3.Listener{}
	mustUnmarshal(t, ls[0].Any.GetValue(), l)
	if sa := l.GetAddress().GetSocketAddress(); sa.GetAddress() != "0.0.0.0" || sa.GetPortValue() != xds.GatewayPort {
		t.Errorf("listener address = %v", sa)
	}
	if lf := l.GetListenerFilters(); len(lf) != 1 || lf[0].GetName() != "envoy.filters.listener.tls_inspector" ||
		!lf[0].GetTypedConfig().MessageIs(&tlsinspectorv3.TlsInspector{}) {
		t.Errorf("listener filters = %v", lf)
	}
	var chains []string
	for _, fc := range l.GetFilterChains() {
		sni := fc.GetFilterChainMatch().GetServerNames()
		if len(sni) != 1 || len(fc.GetFilters()) != 1 || fc.GetFilters()[0].GetName() != "envoy.filters.network.tcp_proxy" {
			t.Fatalf("filter chain %v", fc)
		}
		tp := &tcpproxyv3.TcpProxy{}
		if err := fc.GetFilters()[0].GetTypedConfig().UnmarshalTo(tp); err != nil {
			t.Fatal(err)
		}
		if tp.GetCluster() != sni[0] {
			t.Errorf("chain %s proxies to %s", sni[0], tp.GetCluster())
		}
		chains = append(chains, sni[0])
	}
	if !slices.Equal(chains, wantNames) {
		t.Errorf("SNI chains:\n%s\nwant:\n%s", strings.Join(chains, "\n"), strings.Join(wantNames, "\n"))
	}

	// CDS: exactly those clusters, by EDS; no DNS service.
	cs := c.Resources(v, resourcev3.ClusterType)
	if got := resourceNames(cs); !slices.Equal(got, sortedCopy(wantNames)) {
		t.Errorf("router clusters:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(sortedCopy(wantNames), "\n"))
	}
	for _, r := range cs {
		cl := &clusterv3.Cluster{}
		mustUnmarshal(t, r.Any.GetValue(), cl)
		if cl.GetType() != clusterv3.Cluster_EDS || cl.GetEdsClusterConfig().GetServiceName() != r.Name {
			t.Errorf("cluster %s: type %v service %q", r.Name, cl.GetType(), cl.GetEdsClusterConfig().GetServiceName())
		}
	}

	// EDS: the local, mTLS endpoints only.
	want := map[string][]string{
		"outbound_.8080_._." + gwEcho:   {"10.1.0.1:18080", "10.1.0.2:18080", "10.0.0.7:18080"},
		"outbound_.8080_.v1_." + gwEcho: {"10.1.0.1:18080"},
		"outbound_.8080_.v2_." + gwEcho: {"10.1.0.2:18080", "10.0.0.7:18080"},
		"outbound_.9090_._." + gwEcho:   {"10.1.0.1:9090", "10.1.0.2:9090", "10.0.0.7:9090"},
		"outbound_.9090_.v1_." + gwEcho: {"10.1.0.1:9090"},
		"outbound_.9090_.v2_." + gwEcho: {"10.1.0.2:9090", "10.0.0.7:9090"},
	}
	if got := claEndpoints(t, c.Resources(v, resourcev3.EndpointType)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("router endpoints:\n%v\nwant:\n%v", got, want)
	}

	// A sidecar of the same network gets none of it.
	side := model.View{Kind: model.KindEnvoy, Network: "network1"}
	if got := resourceNames(c.Resources(side, resourcev3.ListenerType)); len(got) != 0 {
		t.Errorf("sidecar listeners = %v", got)
	}
	for _, n := range resourceNames(c.Resources(side, resourcev3.ClusterType)) {
		if strings.HasPrefix(n, "outbound_.") {
			t.Errorf("sidecar got gateway cluster %s", n)
		}
	}
}

// TestGatewayPush: a new service adds its chains to the one listener; an
// endpoint change reaches the gateway's SNI clusters.
func TestGatewayPush(t *testing.T) {
	m := setupGatewayMesh(t)
	c := xds.NewCache(xds.NewGenerator(m.agg, pipeline.New(m.agg, gwNetworks(t, m.agg), nil)))
	v := routerView(t)
	before := c.Resources(v, resourcev3.ListenerType)[0].Version()
	claBefore := claEndpoints(t, c.Resources(v, resourcev3.EndpointType))

	const other = "other.default.svc.cluster.local"
	m.apply("cluster1", gwService(other, registryv1.Resolution_RESOLUTION_STATIC, 7070),
		gwEndpoints(other, &registryv1.Endpoint{Address: "10.1.5.1", TlsMode: registryv1.TLSMode_TLS_MODE_ISTIO}))
	c.Push(model.Change{Services: map[string]bool{other: true}})
	ls := c.Resources(v, resourcev3.ListenerType)
	if len(ls) != 1 || ls[0].Version() == before {
		t.Fatalf("listener not rebuilt for a new service")
	}
	l := &listenerv3.Listener{}
	mustUnmarshal(t, ls[0].Any.GetValue(), l)
	if n := len(l.GetFilterChains()); n != 7 {
		t.Errorf("%d filter chains after adding a one-port service, want 7", n)
	}

	// Endpoints only: 10.1.0.2 goes away.
	m.apply("cluster1", gwEndpoints(gwEcho, gwEP("10.1.0.1", "", "v1", true), gwEP("10.0.0.7", "network1", "v2", true)))
	c.Push(model.Change{Services: map[string]bool{gwEcho: false}})
	after := claEndpoints(t, c.Resources(v, resourcev3.EndpointType))
	name := "outbound_.8080_._." + gwEcho
	if fmt.Sprint(after[name]) != "[10.1.0.1:18080 10.0.0.7:18080]" {
		t.Errorf("%s after the endpoint change = %v (before %v)", name, after[name], claBefore[name])
	}
	if fmt.Sprint(after["outbound_.7070_._."+other]) != "[10.1.5.1:7070]" {
		t.Errorf("new service's gateway endpoints = %v", after["outbound_.7070_._."+other])
	}
}

func resourceNames(rs []*xds.Resource) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Name)
	}
	return out
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func mustUnmarshal(t *testing.T, b []byte, m proto.Message) {
	t.Helper()
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
}

// claEndpoints decodes CLAs into ADDR:PORT lists by cluster name.
func claEndpoints(t *testing.T, rs []*xds.Resource) map[string][]string {
	out := map[string][]string{}
	for _, r := range rs {
		cla := &endpointv3.ClusterLoadAssignment{}
		mustUnmarshal(t, r.Any.GetValue(), cla)
		if cla.GetClusterName() != r.Name {
			t.Errorf("CLA %s names %s", r.Name, cla.GetClusterName())
		}
		for _, le := range cla.GetEndpoints() {
			for _, lb := range le.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				if lb.GetMetadata().GetFilterMetadata()["envoy.transport_socket_match"].GetFields()["tlsMode"].GetStringValue() != "istio" {
					t.Errorf("%s: endpoint %s without tlsMode istio", r.Name, sa.GetAddress())
				}
				out[r.Name] = append(out[r.Name], fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()))
			}
		}
	}
	return out
}
