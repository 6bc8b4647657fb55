package kubernetes

import (
	"strings"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
)

func TestProtocol(t *testing.T) {
	tests := []struct {
		name         string
		port         corev1.ServicePort
		wantProtocol string
	}{
		{"http prefix", corev1.ServicePort{Name: "http-web"}, "HTTP"},
		{"bare name", corev1.ServicePort{Name: "grpc"}, "GRPC"},
		{"upper case", corev1.ServicePort{Name: "HTTP2-x"}, "HTTP2"},
		{"grpc-web before the dash rule", corev1.ServicePort{Name: "grpc-web-ui"}, "GRPC-Web"},
		{"tcp", corev1.ServicePort{Name: "tcp-db"}, "TCP"},
		{"tls", corev1.ServicePort{Name: "tls-passthrough"}, "TLS"},
		{"https", corev1.ServicePort{Name: "https"}, "HTTPS"},
		{"mongo", corev1.ServicePort{Name: "mongo-main"}, "Mongo"},
		{"redis", corev1.ServicePort{Name: "redis"}, "Redis"},
		{"mysql", corev1.ServicePort{Name: "mysql-primary"}, "MySQL"},
		{"unknown prefix is TCP", corev1.ServicePort{Name: "metrics"}, "TCP"},
		{"unnamed is TCP", corev1.ServicePort{}, "TCP"},
		{"appProtocol wins over the name", corev1.ServicePort{Name: "http-x", AppProtocol: ptr.To("grpc")}, "GRPC"},
		{"appProtocol h2c", corev1.ServicePort{Name: "web", AppProtocol: ptr.To("kubernetes.io/h2c")}, "HTTP2"},
		{"appProtocol wss", corev1.ServicePort{AppProtocol: ptr.To("kubernetes.io/wss")}, "HTTPS"},
		{"a set appProtocol replaces the name, as in Istio", corev1.ServicePort{Name: "http", AppProtocol: ptr.To("")}, "TCP"},
		{"well-known port", corev1.ServicePort{Name: "db", Port: 3306}, "TCP"},
		{"http_proxy", corev1.ServicePort{Name: "http_proxy"}, "HTTP_PROXY"},
		{"UDP whatever the name", corev1.ServicePort{Name: "http-dns", Protocol: corev1.ProtocolUDP}, "UDP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := protocol(tt.port); got != tt.wantProtocol {
				t.Errorf("protocol(%+v) = %q, want %q", tt.port, got, tt.wantProtocol)
			}
		})
	}
}

func svcObj(name string, mutate func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns1", Labels: map[string]string{"app": name}},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "grpc-api", Port: 9090}},
		},
	}
	if mutate != nil {
		mutate(s)
	}
	return s
}

func TestConvertService(t *testing.T) {
	conv := &converter{clusterID: "c1", domainSuffix: "example.local"}
	ports := []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}, {Name: "grpc-api", Number: 9090, Protocol: "GRPC"}}
	tests := []struct {
		name string
		svc  *corev1.Service
		want *sdk.Service
	}{
		{"cluster IP", svcObj("a", nil), &sdk.Service{
			Hostname: "a.ns1.svc.example.local", Namespace: "ns1", Name: "a", Ports: ports,
			VIPs: map[string][]string{"c1": {"10.96.0.10"}}, Labels: map[string]string{"app": "a"},
		}},
		{"own mTLS mode", svcObj("a", func(s *corev1.Service) { s.Annotations = map[string]string{"estuary.io/mtls-mode": "STRICT"} }), &sdk.Service{
			Hostname: "a.ns1.svc.example.local", Namespace: "ns1", Name: "a", Ports: ports,
			VIPs: map[string][]string{"c1": {"10.96.0.10"}}, Labels: map[string]string{"app": "a"},
			MTLSMode: sdk.MTLSModeStrict, MTLSModeSource: "annotation estuary.io/mtls-mode",
		}},
		{"an mTLS mode that is no mode follows the mesh", svcObj("a", func(s *corev1.Service) { s.Annotations = map[string]string{"estuary.io/mtls-mode": "strict"} }), &sdk.Service{
			Hostname: "a.ns1.svc.example.local", Namespace: "ns1", Name: "a", Ports: ports,
			VIPs: map[string][]string{"c1": {"10.96.0.10"}}, Labels: map[string]string{"app": "a"},
		}},
		{"own locality failover", svcObj("a", func(s *corev1.Service) { s.Annotations = map[string]string{"estuary.io/locality-failover": "false"} }), &sdk.Service{
			Hostname: "a.ns1.svc.example.local", Namespace: "ns1", Name: "a", Ports: ports,
			VIPs: map[string][]string{"c1": {"10.96.0.10"}}, Labels: map[string]string{"app": "a"},
			LocalityFailover: sdk.LocalityFailoverOff,
		}},
		{"a locality failover that is no bool follows the mesh", svcObj("a", func(s *corev1.Service) { s.Annotations = map[string]string{"estuary.io/locality-failover": "yes"} }), &sdk.Service{
			Hostname: "a.ns1.svc.example.local", Namespace: "ns1", Name: "a", Ports: ports,
			VIPs: map[string][]string{"c1": {"10.96.0.10"}}, Labels: map[string]string{"app": "a"},
		}},
		{"dual stack", svcObj("a", func(s *corev1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"} }), &sdk.Service{
			Hostname: "a.ns1.svc.example.local", Namespace: "ns1", Name: "a", Ports: ports,
			VIPs: map[string][]string{"c1": {"10.96.0.10", "fd00::10"}}, Labels: map[string]string{"app": "a"},
		}},
		{"headless", svcObj("h", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }), &sdk.Service{
			Hostname: "h.ns1.svc.example.local", Namespace: "ns1", Name: "h", Ports: ports,
			Labels: map[string]string{"app": "h"}, Resolution: sdk.ResolutionPassthrough,
		}},
		{"external name", svcObj("x", func(s *corev1.Service) {
			s.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.com", Ports: s.Spec.Ports}
		}), &sdk.Service{
			Hostname: "x.ns1.svc.example.local", Namespace: "ns1", Name: "x", Ports: ports,
			Labels: map[string]string{"app": "x"}, Resolution: sdk.ResolutionDNS, MeshExternal: true,
		}},
		{"load balancer", svcObj("lb", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.Ports[1].NodePort = 30090
			s.Spec.ExternalIPs = []string{"192.0.2.1"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.7"}, {Hostname: "lb.example.com"}, {IP: "192.0.2.1"}}
		}), &sdk.Service{
			Hostname: "lb.ns1.svc.example.local", Namespace: "ns1", Name: "lb", Ports: ports,
			VIPs:              map[string][]string{"c1": {"10.96.0.10"}},
			ExternalAddresses: map[string][]string{"c1": {"192.0.2.1", "198.51.100.7", "lb.example.com"}},
			NodePorts:         map[string]map[uint32]uint32{"c1": {80: 30080, 9090: 30090}},
			Labels:            map[string]string{"app": "lb"},
		}},
		{"node port with export and SCTP", svcObj("np", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports = []corev1.ServicePort{{Name: "tcp", Port: 5000, NodePort: 31000}, {Name: "sig", Port: 2905, Protocol: corev1.ProtocolSCTP}}
			s.Annotations = map[string]string{istio.AnnotationExportTo: ". , istio-system"}
		}), &sdk.Service{
			Hostname: "np.ns1.svc.example.local", Namespace: "ns1", Name: "np",
			Ports:     []sdk.Port{{Name: "tcp", Number: 5000, Protocol: "TCP"}},
			VIPs:      map[string][]string{"c1": {"10.96.0.10"}},
			NodePorts: map[string]map[uint32]uint32{"c1": {5000: 31000}},
			Labels:    map[string]string{"app": "np"},
			ExportTo:  []string{".", "istio-system"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := conv.service(tt.svc)
			if !got.Equal(tt.want) {
				t.Errorf("service =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

// fakeObjects serves pods and nodes from maps, for pure conversion tests.
type fakeObjects struct {
	pods  map[string]*podInfo
	nodes map[string]*corev1.Node
	ready map[string]bool
}

func (f *fakeObjects) pod(ns, name string) *podInfo  { return f.pods[ns+"/"+name] }
func (f *fakeObjects) node(name string) *corev1.Node { return f.nodes[name] }
func (f *fakeObjects) nodeList() []*corev1.Node {
	var out []*corev1.Node
	for _, n := range f.nodes {
		out = append(out, n)
	}
	return out
}

// gatewayObjects on top of fakeObjects.
type fakeGatewayObjects struct{ *fakeObjects }

func (f fakeGatewayObjects) nodes() []*corev1.Node                         { return f.nodeList() }
func (f fakeGatewayObjects) endpointNodes(*corev1.Service) map[string]bool { return f.ready }

func podObj(name string, labels map[string]string, node, sa string) *podInfo {
	p, err := transformPod(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns1", Labels: labels, Annotations: map[string]string{"a": "b"}},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: sa, Containers: []corev1.Container{{Name: "c"}}},
	})
	if err != nil {
		panic(err)
	}
	return p.(*podInfo)
}

func nodeObj(name string, labels map[string]string, externalIPs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.0.0.1"})
	for _, ip := range externalIPs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip})
	}
	return n
}

type epSpec struct {
	addr      string
	ready     *bool
	pod, node string
	zone      string
	podNS     string
}

func sliceObj(name string, ports map[string]int32, eps ...epSpec) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "ns1", Labels: map[string]string{labelServiceName: "a"}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for n, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr.To(n), Port: ptr.To(p)})
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{Addresses: []string{e.addr}, Conditions: discoveryv1.EndpointConditions{Ready: e.ready}}
		if e.pod != "" {
			ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: e.pod, Namespace: e.podNS}
		}
		if e.node != "" {
			ep.NodeName = ptr.To(e.node)
		}
		if e.zone != "" {
			ep.Zone = ptr.To(e.zone)
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

func TestConvertEndpoints(t *testing.T) {
	objs := &fakeObjects{
		pods: map[string]*podInfo{
			"ns1/p1": podObj("p1", map[string]string{"app": "a", "version": "v1", istio.LabelTLSMode: "istio"}, "n1", "reader"),
			"ns1/p2": podObj("p2", map[string]string{"app": "a", istio.LabelNetwork: "net-pod"}, "n2", ""),
			"ns1/p3": podObj("p3", map[string]string{"app": "a"}, "n1", "reader"),
		},
		nodes: map[string]*corev1.Node{
			"n1": nodeObj("n1", map[string]string{corev1.LabelTopologyRegion: "eu", corev1.LabelTopologyZone: "eu-1", istio.LabelSubzone: "rack7"}),
			"n2": nodeObj("n2", map[string]string{corev1.LabelTopologyRegion: "us", corev1.LabelTopologyZone: "us-2"}),
		},
	}
	ports := map[string]uint32{"http": 8080, "grpc-api": 9000}
	p1 := sdk.Endpoint{
		Address: "10.1.0.1", TargetPorts: ports, Labels: objs.pods["ns1/p1"].Labels, Network: "net-default",
		Locality: sdk.Locality{Region: "eu", Zone: "eu-1", Subzone: "rack7"}, TLSMode: sdk.TLSModeIstio,
		ServiceAccount: "spiffe://td.local/ns/ns1/sa/reader", WorkloadName: "p1",
	}
	p2 := sdk.Endpoint{
		Address: "10.1.0.2", TargetPorts: ports, Labels: objs.pods["ns1/p2"].Labels, Network: "net-pod",
		Locality: sdk.Locality{Region: "us", Zone: "us-2"}, WorkloadName: "p2",
	}
	slicePorts := map[string]int32{"http": 8080, "grpc-api": 9000, "unknown": 1}
	tests := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   []sdk.Endpoint
	}{
		{
			name: "ready endpoints with pod and node data",
			svc:  svcObj("a", nil),
			slices: []*discoveryv1.EndpointSlice{sliceObj("a-1", slicePorts,
				epSpec{addr: "10.1.0.1", pod: "p1", node: "n1"},
				epSpec{addr: "10.1.0.2", pod: "p2", ready: ptr.To(true)}, // node from the pod
				epSpec{addr: "10.1.0.3", pod: "p3", node: "n1", ready: ptr.To(false)},
			)},
			want: []sdk.Endpoint{p1, p2},
		},
		{
			name: "publishNotReadyAddresses keeps unready endpoints",
			svc:  svcObj("a", func(s *corev1.Service) { s.Spec.PublishNotReadyAddresses = true }),
			slices: []*discoveryv1.EndpointSlice{sliceObj("a-1", map[string]int32{"http": 8080},
				epSpec{addr: "10.1.0.9", ready: ptr.To(false), zone: "z9"},
			)},
			want: []sdk.Endpoint{{Address: "10.1.0.9", TargetPorts: map[string]uint32{"http": 8080}, Network: "net-default", Locality: sdk.Locality{Zone: "z9"}}},
		},
		{
			name: "an address in two slices appears once with the ports of both",
			svc:  svcObj("a", nil),
			slices: []*discoveryv1.EndpointSlice{
				sliceObj("a-1", map[string]int32{"http": 8080}, epSpec{addr: "10.1.0.5"}),
				sliceObj("a-2", map[string]int32{"grpc-api": 9000}, epSpec{addr: "10.1.0.5"}, epSpec{addr: "10.1.0.6"}),
			},
			want: []sdk.Endpoint{
				{Address: "10.1.0.5", TargetPorts: ports, Network: "net-default"},
				{Address: "10.1.0.6", TargetPorts: map[string]uint32{"grpc-api": 9000}, Network: "net-default"},
			},
		},
		{
			name: "pod without node: endpoint zone hint",
			svc:  svcObj("a", nil),
			slices: []*discoveryv1.EndpointSlice{sliceObj("a-1", nil,
				epSpec{addr: "10.1.0.7", pod: "gone", zone: "z1"},
			)},
			want: []sdk.Endpoint{{Address: "10.1.0.7", Network: "net-default", Locality: sdk.Locality{Zone: "z1"}, WorkloadName: "gone"}},
		},
		{
			name: "external name",
			svc: svcObj("x", func(s *corev1.Service) {
				s.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "db.example.com"}
			}),
			want: []sdk.Endpoint{{Address: "db.example.com", Network: "net-default"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conv := &converter{clusterID: "c1", domainSuffix: "cluster.local", trustDomain: "td.local", network: "net-default"}
			got := conv.endpoints(tt.svc, tt.slices, objs)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d endpoints %+v, want %d %+v", len(got), got, len(tt.want), tt.want)
			}
			for i := range got {
				if !got[i].Equal(&tt.want[i]) {
					t.Errorf("endpoint %d =\n%+v\nwant\n%+v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestIdentityInterned(t *testing.T) {
	conv := &converter{trustDomain: "cluster.local"}
	a, b := conv.identity("ns", "sa"), conv.identity("ns", "sa")
	if a != "spiffe://cluster.local/ns/ns/sa/sa" || b != a {
		t.Errorf("identity = %q, %q", a, b)
	}
	if unsafe.StringData(a) != unsafe.StringData(b) {
		t.Errorf("identity not interned: two copies of %q", a)
	}
	if conv.identity("ns", "") != "" {
		t.Errorf("a pod without service account has an identity")
	}
}

// TestAnnotationErr: the Service's notice names every bad Estuary
// annotation, and there is none when both are good or absent.
func TestAnnotationErr(t *testing.T) {
	if err := annotationErr(svcObj("a", func(s *corev1.Service) {
		s.Annotations = map[string]string{"estuary.io/mtls-mode": "STRICT", "estuary.io/locality-failover": "true"}
	})); err != nil {
		t.Errorf("good annotations: %v", err)
	}
	err := annotationErr(svcObj("a", func(s *corev1.Service) {
		s.Annotations = map[string]string{"estuary.io/mtls-mode": "strict", "estuary.io/locality-failover": "on"}
	}))
	for _, want := range []string{`annotation estuary.io/mtls-mode = "strict" ignored`, `annotation estuary.io/locality-failover = "on" ignored, the service follows the mesh's locality_failover`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad annotations: %v; want %q", err, want)
		}
	}
}
