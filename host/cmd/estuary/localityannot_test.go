package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/consul/api"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/estuary-mesh/estuary/testbed"
)

// priorities are, per cluster, each locality's priority as received:
// "outbound|8080||echo... " -> "region1/zone-b" -> 1.
type priorities map[string]map[string]uint32

// localityEDS is an Envoy sidecar in a locality over a real ADS stream
// (grpc-go's client; no Envoy runs here): it takes every cluster and
// subscribes to the CLAs of the EDS ones, acknowledging each response as
// Envoy does, and keeps the node connected until the test ends.
type localityEDS struct {
	t     *testing.T
	resps chan priorities
	last  priorities // the last response until took, for its failure message
}

func watchLocalityEDS(t *testing.T, xdsAddr, id, region, zone string) *localityEDS {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream := openADS(t, ctx, xdsAddr)
	meta, _ := structpb.NewStruct(map[string]any{"CLUSTER_ID": "cluster1"})
	node := &corev3.Node{Id: id, Metadata: meta, Locality: &corev3.Locality{Region: region, Zone: zone}}
	w := &localityEDS{t: t, resps: make(chan priorities, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		send := func(req *discoveryv3.DiscoveryRequest) bool {
			req.Node = node
			return stream.Send(req) == nil
		}
		if !send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType}) {
			return
		}
		var names []string
		got := priorities{}
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			ack := &discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
			switch resp.GetTypeUrl() {
			case resourcev3.ClusterType:
				var eds []string
				for _, r := range resp.GetResources() {
					var c clusterv3.Cluster
					if r.UnmarshalTo(&c) == nil && c.GetType() == clusterv3.Cluster_EDS {
						eds = append(eds, c.GetName())
					}
				}
				slices.Sort(eds)
				if !send(ack) {
					return
				}
				if len(eds) > 0 && !slices.Equal(eds, names) {
					names = eds
					if !send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names}) {
						return
					}
				}
				continue
			case resourcev3.EndpointType:
				ack.ResourceNames = names
				if !send(ack) {
					return
				}
				for _, r := range resp.GetResources() {
					var cla endpointv3.ClusterLoadAssignment
					if r.UnmarshalTo(&cla) != nil {
						continue
					}
					p := map[string]uint32{}
					for _, le := range cla.GetEndpoints() {
						l := le.GetLocality()
						p[l.GetRegion()+"/"+l.GetZone()] = le.GetPriority()
					}
					got[cla.GetClusterName()] = p
				}
			default:
				continue
			}
			snap := priorities{}
			for k, v := range got {
				snap[k] = v
			}
			select {
			case w.resps <- snap:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return w
}

// until waits for an EDS response after which the priorities received
// satisfy ok, and returns them.
func (w *localityEDS) until(what string, ok func(priorities) bool) priorities {
	w.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case p := <-w.resps:
			w.last = p
			if ok(p) {
				return p
			}
		case <-deadline:
			w.t.Fatalf("timed out waiting for EDS where %s; last received %v", what, w.last)
		}
	}
}

// spread reports whether every locality of cluster c is at priority 0
// and there are want of them (locality failover off).
func spread(p priorities, c string, want int) bool {
	if len(p[c]) != want {
		return false
	}
	for _, prio := range p[c] {
		if prio != 0 {
			return false
		}
	}
	return true
}

// localityMesh is a plugins.hcl whose mesh has locality failover off, so
// only a service that opts in gets priorities.
func localityMesh(plugins string) func(xds, admin string) string {
	return func(xds, admin string) string {
		return strings.Replace(hostConfig(xds, admin, plugins), "cluster_id = \"cluster1\"\n", "cluster_id = \"cluster1\"\n  locality_failover = false\n", 1)
	}
}

// TestKubernetesLocalityFailoverAnnotation: a real API server; the
// annotation estuary.io/locality-failover: "true" on echo gives echo's
// CLA, as an Envoy node in region1/zone-a receives it over ADS, priority
// 0 for zone-a and 1 for zone-b, while other, in the same zones, stays in
// one priority as the mesh says. A value that is no bool is a notice
// for the Service, and echo follows the mesh again.
func TestKubernetesLocalityFailoverAnnotation(t *testing.T) {
	k := testbed.StartKube(t)
	ctx := context.Background()
	c := k.Client()
	const ns = "default"
	for _, n := range []struct{ name, zone string }{{"node-a", "zone-a"}, {"node-b", "zone-b"}} {
		if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
			corev1.LabelTopologyRegion: "region1", corev1.LabelTopologyZone: n.zone,
		}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ready := true
	port, portName := int32(8080), "grpc"
	for i, name := range []string{"echo", "other"} {
		if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.0.%d", 20+i), Ports: []corev1.ServicePort{{Name: portName, Port: port}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var eps []discoveryv1.Endpoint
		for j, node := range []string{"node-a", "node-b"} {
			eps = append(eps, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.1.%d.%d", i, j+1)}, NodeName: &node, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
		}
		if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   eps,
			Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h := startHostFile(t, localityMesh(fmt.Sprintf("plugin \"kubernetes\" {\n  config {\n    kubeconfig = %q\n    cluster_id = \"cluster1\"\n  }\n}\n", k.Kubeconfig)))
	w := watchLocalityEDS(t, h.xds, sidecarNode, "region1", "zone-a")
	w.until("echo and other in one priority, as the mesh says", func(p priorities) bool {
		return spread(p, echoCluster, 2) && spread(p, otherCluster, 2)
	})

	annotate := func(v *string) {
		t.Helper()
		svc, err := c.CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Annotations = nil
		if v != nil {
			svc.Annotations = map[string]string{"estuary.io/locality-failover": *v}
		}
		if _, err := c.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	on := "true"
	annotate(&on)
	got := w.until("echo in priorities by zone", func(p priorities) bool {
		return p[echoCluster]["region1/zone-a"] == 0 && p[echoCluster]["region1/zone-b"] == 1
	})
	if !spread(got, otherCluster, 2) {
		t.Errorf("echo's annotation changed other's priorities: %v", got[otherCluster])
	}

	bad := "yes"
	annotate(&bad)
	w.until("echo in one priority again", func(p priorities) bool { return spread(p, echoCluster, 2) })
	h.noticeUntilFixed("Service default/echo", "ignored, the service follows the mesh's locality_failover", func() { annotate(nil) })
}

// TestConsulLocalityFailoverMeta: a real Consul agent; the service meta
// locality_failover = "true" of web's instances gives web's CLA, as an
// Envoy node in dc1/zone-a receives it, priorities by zone, and leaves
// api, with instances in the same zones, in one priority.
func TestConsulLocalityFailoverMeta(t *testing.T) {
	c := testbed.StartConsul(t)
	// Instances on two nodes of two zones: the catalog API, as Consul's
	// own tooling registers external services.
	register := func(service string, meta map[string]string) {
		t.Helper()
		for i, zone := range []string{"zone-a", "zone-b"} {
			addr := fmt.Sprintf("10.3.%d.%d", map[string]int{"web": 1, "api": 2}[service], i+1)
			if _, err := c.Client().Catalog().Register(&api.CatalogRegistration{
				Node: "node-" + zone, Address: fmt.Sprintf("10.9.0.%d", i+1), NodeMeta: map[string]string{"zone": zone},
				Service: &api.AgentService{ID: service + "-" + zone, Service: service, Address: addr, Port: 8080, Meta: meta},
			}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	register("web", nil)
	register("api", nil)
	h := startHostFile(t, localityMesh(fmt.Sprintf("plugin \"consul\" {\n  config {\n    address = %q\n  }\n}\n", c.Addr)))
	const web, apiCluster = "outbound|8080||web.service.consul", "outbound|8080||api.service.consul"
	w := watchLocalityEDS(t, h.xds, sidecarNode, "dc1", "zone-a")
	w.until("web and api in one priority, as the mesh says", func(p priorities) bool {
		return spread(p, web, 2) && spread(p, apiCluster, 2)
	})

	register("web", map[string]string{"locality_failover": "true"})
	got := w.until("web in priorities by zone", func(p priorities) bool {
		return p[web]["dc1/zone-a"] == 0 && p[web]["dc1/zone-b"] == 1
	})
	if !spread(got, apiCluster, 2) {
		t.Errorf("web's meta changed api's priorities: %v", got[apiCluster])
	}

	// A value that is no bool: a notice, and the mesh's setting again.
	register("web", map[string]string{"locality_failover": "yes"})
	w.until("web in one priority again", func(p priorities) bool { return spread(p, web, 2) })
	h.eventually("a notice about the bad meta", 30*time.Second, func() bool {
		_, b := h.get("/debug/registryz")
		return strings.Contains(string(b), `meta locality_failover = \"yes\" ignored: want \"true\" or \"false\"`)
	})
}

// TestServiceEntryLocalityFailoverAnnotation: the serviceentry plugin's
// directory; the annotation estuary.io/locality-failover: "true" on the
// ServiceEntry of near.example.com gives its CLA, as an Envoy node in
// region1/zone-a receives it, priorities by zone, and leaves
// far.example.com, with endpoints in the same zones, in one priority.
func TestServiceEntryLocalityFailoverAnnotation(t *testing.T) {
	dir := t.TempDir()
	write := func(annotation string) {
		t.Helper()
		var b strings.Builder
		for i, name := range []string{"near", "far"} {
			ann := ""
			if name == "near" && annotation != "" {
				ann = fmt.Sprintf("  annotations:\n    estuary.io/locality-failover: %q\n", annotation)
			}
			fmt.Fprintf(&b, `---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: %s
  namespace: default
%sspec:
  hosts: [%s.example.com]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 8080, name: grpc, protocol: GRPC}
  endpoints:
  - {address: 10.4.%d.1, locality: region1/zone-a}
  - {address: 10.4.%d.2, locality: region1/zone-b}
`, name, ann, name, i, i)
		}
		if err := os.WriteFile(filepath.Join(dir, "entries.yaml"), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	h := startHostFile(t, localityMesh(fmt.Sprintf("plugin \"serviceentry\" {\n  config {\n    dir        = %q\n    cluster_id = \"cluster1\"\n  }\n}\n", dir)))
	const near, far = "outbound|8080||near.example.com", "outbound|8080||far.example.com"
	w := watchLocalityEDS(t, h.xds, sidecarNode, "region1", "zone-a")
	w.until("near and far in one priority, as the mesh says", func(p priorities) bool { return spread(p, near, 2) && spread(p, far, 2) })

	write("true")
	got := w.until("near in priorities by zone", func(p priorities) bool {
		return p[near]["region1/zone-a"] == 0 && p[near]["region1/zone-b"] == 1
	})
	if !spread(got, far, 2) {
		t.Errorf("near's annotation changed far's priorities: %v", got[far])
	}
	write("yes")
	w.until("near in one priority again", func(p priorities) bool { return spread(p, near, 2) })
	h.eventually("a notice about the bad annotation", 30*time.Second, func() bool {
		_, b := h.get("/debug/registryz")
		return strings.Contains(string(b), "ignored, the hosts follow the mesh's locality_failover")
	})
}

// TestConsulScopeErrorsPositioned: a reload whose consul block sets both
// namespace and namespaces, and a partition name that cannot be one, is
// refused by the plugin with each problem at its file:line:col, and the
// running config keeps serving the agent's services.
func TestConsulScopeErrorsPositioned(t *testing.T) {
	c := testbed.StartConsul(t)
	if err := c.Client().Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "web-1", Name: "web", Address: "10.0.0.1", Port: 8080}); err != nil {
		t.Fatal(err)
	}
	block := func(attrs string) string {
		return fmt.Sprintf("plugin \"consul\" {\n  config {\n    address = %q\n%s  }\n}\n", c.Addr, attrs)
	}
	h := startHost(t, block("    namespaces = [\"default\"]\n"))
	served := func() bool {
		var r registryz
		h.getJSON("/debug/registryz", &r)
		return slices.Contains(r.hostnames("consul"), "web.service.consul")
	}
	h.eventually("web served", 30*time.Second, served)
	// The mesh, xds and admin blocks take lines 1-10; the plugin block
	// starts at 11, its attributes at 14.
	h.reloadWith(block("    namespace  = \"team-a\"\n    namespaces = [\"default\"]\n    partitions = [\"p 1\"]\n"))
	h.eventually("the plugin to refuse the config", 30*time.Second, func() bool { return h.logCount("some plugins kept their previous config") == 1 })
	for _, want := range []string{
		`plugins.hcl:15:5: error: plugin "consul": set namespace or namespaces, not both`,
		`plugins.hcl:16:5: error: plugin "consul": partition "p 1" is not a Consul partition name`,
	} {
		if !strings.Contains(h.log.String(), want) {
			t.Errorf("the rejection lacks %q:\n%s", want, h.log.String())
		}
	}
	if !served() {
		t.Error("the rejected reload stopped the running config")
	}
}
