package kubernetes

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/istio"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

func gatewaySvc(mutate func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "eastwest", Namespace: "istio-system", Labels: map[string]string{istio.LabelNetwork: "net1"}},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeLoadBalancer,
			ClusterIP: "10.96.0.20",
			Ports:     []corev1.ServicePort{{Name: "tls", Port: 15443, NodePort: 31443}, {Name: "tls-alt", Port: 16443, NodePort: 31644}},
		},
	}
	mutate(s)
	return s
}

func nodePortGateway(selector string, local bool) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Annotations = map[string]string{istio.AnnotationNodeSelector: selector}
		if local {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
	}
}

func TestGateways(t *testing.T) {
	objs := fakeGatewayObjects{&fakeObjects{
		nodes: map[string]*corev1.Node{
			"n1": nodeObj("n1", map[string]string{"gw": "yes", corev1.LabelTopologyRegion: "eu", corev1.LabelTopologyZone: "eu-1"}, "203.0.113.1"),
			"n2": nodeObj("n2", map[string]string{"gw": "yes"}),
			"n3": nodeObj("n3", map[string]string{"gw": "no"}, "203.0.113.3"),
			"n4": nodeObj("n4", map[string]string{"gw": "yes", corev1.LabelTopologyRegion: "us"}, "203.0.113.4"),
		},
		ready: map[string]bool{"n1": true},
	}}
	eu := sdk.Locality{Region: "eu", Zone: "eu-1"}
	tests := []struct {
		name        string
		svc         *corev1.Service
		want        []sdk.NetworkGateway
		wantNotices []string // substrings, one notice each, in order
	}{
		{
			name: "not a gateway without the network label",
			svc:  gatewaySvc(func(s *corev1.Service) { s.Labels = nil }),
		},
		{
			name: "load balancer ingress IP and hostname",
			svc: gatewaySvc(func(s *corev1.Service) {
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}, {Hostname: "gw.example.com"}}
			}),
			want: []sdk.NetworkGateway{
				{Network: "net1", Cluster: "c1", Address: "198.51.100.1", Port: 15443},
				{Network: "net1", Cluster: "c1", Address: "gw.example.com", Port: 15443},
			},
		},
		{
			name: "load balancer without ingress yet",
			svc:  gatewaySvc(func(s *corev1.Service) {}),
			wantNotices: []string{
				"no gateway address: the LoadBalancer has no ingress yet",
			},
		},
		{
			name: "externalIPs with a custom gatewayPort label",
			svc: gatewaySvc(func(s *corev1.Service) {
				s.Spec.Type = corev1.ServiceTypeClusterIP
				s.Spec.ExternalIPs = []string{"192.0.2.10", "192.0.2.11"}
				s.Labels[istio.LabelGatewayPort] = "16443"
			}),
			want: []sdk.NetworkGateway{
				{Network: "net1", Cluster: "c1", Address: "192.0.2.10", Port: 16443},
				{Network: "net1", Cluster: "c1", Address: "192.0.2.11", Port: 16443},
			},
		},
		{
			name: "gatewayPort as annotation",
			svc: gatewaySvc(func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.10"}
				s.Annotations = map[string]string{istio.LabelGatewayPort: "8443"}
			}),
			want: []sdk.NetworkGateway{{Network: "net1", Cluster: "c1", Address: "192.0.2.10", Port: 8443}},
		},
		{
			name: "bad gatewayPort falls back to 15443",
			svc: gatewaySvc(func(s *corev1.Service) {
				s.Spec.ExternalIPs = []string{"192.0.2.10"}
				s.Labels[istio.LabelGatewayPort] = "tls"
			}),
			want:        []sdk.NetworkGateway{{Network: "net1", Cluster: "c1", Address: "192.0.2.10", Port: 15443}},
			wantNotices: []string{`networking.istio.io/gatewayPort "tls" is not a port number`},
		},
		{
			name: "node port with node selector",
			svc:  gatewaySvc(nodePortGateway(`{"gw": "yes"}`, false)),
			want: []sdk.NetworkGateway{
				{Network: "net1", Cluster: "c1", Address: "203.0.113.1", Port: 31443, Locality: eu},
				{Network: "net1", Cluster: "c1", Address: "203.0.113.4", Port: 31443, Locality: sdk.Locality{Region: "us"}},
			},
			wantNotices: []string{"node n2 dropped: it has no ExternalIP address"},
		},
		{
			name: "node port with externalTrafficPolicy Local uses nodes with ready endpoints",
			svc:  gatewaySvc(nodePortGateway(`{"gw": "yes"}`, true)),
			want: []sdk.NetworkGateway{{Network: "net1", Cluster: "c1", Address: "203.0.113.1", Port: 31443, Locality: eu}},
			wantNotices: []string{
				"node n2 dropped: it has no ExternalIP address",
				"node n4 (203.0.113.4) dropped: externalTrafficPolicy is Local and no ready endpoint",
			},
		},
		{
			name: "node port with a LabelSelector and a custom port",
			svc: gatewaySvc(func(s *corev1.Service) {
				nodePortGateway(`{"matchExpressions": [{"key": "gw", "operator": "In", "values": ["no"]}]}`, false)(s)
				s.Labels[istio.LabelGatewayPort] = "16443"
			}),
			want: []sdk.NetworkGateway{{Network: "net1", Cluster: "c1", Address: "203.0.113.3", Port: 31644}},
		},
		{
			name: "empty node selector selects every node",
			svc:  gatewaySvc(nodePortGateway(`{}`, false)),
			want: []sdk.NetworkGateway{
				{Network: "net1", Cluster: "c1", Address: "203.0.113.1", Port: 31443, Locality: eu},
				{Network: "net1", Cluster: "c1", Address: "203.0.113.3", Port: 31443},
				{Network: "net1", Cluster: "c1", Address: "203.0.113.4", Port: 31443, Locality: sdk.Locality{Region: "us"}},
			},
			wantNotices: []string{"node n2 dropped"},
		},
		{
			name: "node port gateway port without node port",
			svc: gatewaySvc(func(s *corev1.Service) {
				nodePortGateway(`{"gw": "yes"}`, false)(s)
				s.Labels[istio.LabelGatewayPort] = "9999"
			}),
			wantNotices: []string{"the service has no port 9999"},
		},
		{
			name:        "bad node selector",
			svc:         gatewaySvc(nodePortGateway(`gw=yes`, false)),
			wantNotices: []string{"traffic.istio.io/nodeSelector: \"gw=yes\" is neither a JSON map"},
		},
		{
			name:        "node selector matching nothing",
			svc:         gatewaySvc(nodePortGateway(`{"gw": "never"}`, false)),
			wantNotices: []string{"no node matches"},
		},
		{
			name: "node port without selector",
			svc:  gatewaySvc(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }),
			wantNotices: []string{
				"a NodePort gateway needs the traffic.istio.io/nodeSelector annotation",
			},
		},
		{
			name: "node selector on a load balancer is ignored",
			svc: gatewaySvc(func(s *corev1.Service) {
				s.Annotations = map[string]string{istio.AnnotationNodeSelector: `{}`}
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}}
			}),
			want:        []sdk.NetworkGateway{{Network: "net1", Cluster: "c1", Address: "198.51.100.1", Port: 15443}},
			wantNotices: []string{"traffic.istio.io/nodeSelector ignored: the service's type is LoadBalancer"},
		},
		{
			name: "address override replaces discovered addresses",
			svc: gatewaySvc(func(s *corev1.Service) {
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}}
				s.Annotations = map[string]string{annotationGatewayAddress: "203.0.113.99:443, gw.example.com,[2001:db8::1]:8443, bad host!"}
			}),
			want: []sdk.NetworkGateway{
				{Network: "net1", Cluster: "c1", Address: "203.0.113.99", Port: 443},
				{Network: "net1", Cluster: "c1", Address: "gw.example.com", Port: 15443},
				{Network: "net1", Cluster: "c1", Address: "2001:db8::1", Port: 8443},
			},
			wantNotices: []string{
				`"bad host!" is neither an IP address nor a host name`,
				"address 198.51.100.1 dropped: replaced by the estuary.io/gateway-address annotation",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gws, notices := gateways("c1", []*corev1.Service{tt.svc}, objs)
			if !slices.Equal(gws, tt.want) {
				t.Errorf("gateways =\n%+v\nwant\n%+v", gws, tt.want)
			}
			if len(notices) != len(tt.wantNotices) {
				t.Fatalf("notices = %+v, want %d: %q", notices, len(tt.wantNotices), tt.wantNotices)
			}
			for i, n := range notices {
				if n.Subject != "service istio-system/eastwest" || !strings.Contains(n.Message, tt.wantNotices[i]) {
					t.Errorf("notice %d = %+v, want subject %q and a message with %q", i, n, "service istio-system/eastwest", tt.wantNotices[i])
				}
			}
		})
	}
}

// TestGatewayDiscovery creates gateway services of every kind on a real API
// server and checks the NetworkGateways the instance reports, and that node,
// endpoint and service changes update them.
func TestGatewayDiscovery(t *testing.T) {
	tb := testbed.StartKube(t)
	k := kube{t, tb.Client()}
	ns := k.namespace("gw", nil)
	k.node("n1", map[string]string{"gw": "yes", corev1.LabelTopologyRegion: "eu"}, "203.0.113.1")
	k.node("n2", map[string]string{"gw": "yes"}, "203.0.113.2")
	k.node("n3", map[string]string{"gw": "yes"})
	tlsPort := []corev1.ServicePort{{Name: "tls", Port: 15443}}
	gwService := func(name, network string, typ corev1.ServiceType, mutate func(*corev1.Service)) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{istio.LabelNetwork: network}},
			Spec:       corev1.ServiceSpec{Type: typ, Ports: slices.Clone(tlsPort)},
		}
		if mutate != nil {
			mutate(s)
		}
		return k.service(s)
	}
	setIngress := func(name string, ingress ...corev1.LoadBalancerIngress) {
		t.Helper()
		svc, err := k.c.CoreV1().Services(ns).Get(ctxb, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Status.LoadBalancer.Ingress = ingress
		if _, err := k.c.CoreV1().Services(ns).UpdateStatus(ctxb, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update status of %s: %v", name, err)
		}
	}

	gwService("lb", "net-lb", corev1.ServiceTypeLoadBalancer, nil)
	setIngress("lb", corev1.LoadBalancerIngress{IP: "198.51.100.1"})
	gwService("ext", "net-ext", corev1.ServiceTypeClusterIP, func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{"192.0.2.10"}
		s.Labels[istio.LabelGatewayPort] = "16443"
		s.Spec.Ports = []corev1.ServicePort{{Name: "tls", Port: 16443}}
	})
	np := gwService("np", "net-np", corev1.ServiceTypeNodePort, func(s *corev1.Service) {
		s.Annotations = map[string]string{istio.AnnotationNodeSelector: `{"gw": "yes"}`}
	})
	npl := gwService("npl", "net-local", corev1.ServiceTypeNodePort, func(s *corev1.Service) {
		s.Annotations = map[string]string{istio.AnnotationNodeSelector: `{"gw": "yes"}`}
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	k.slice(endpointSlice(ns, "npl-1", "npl", map[string]int32{"tls": 15443}, epSpec{addr: "10.30.0.2", node: "n2"}, epSpec{addr: "10.30.0.1", node: "n1", ready: ready(false)}))
	gwService("ovr", "net-ovr", corev1.ServiceTypeLoadBalancer, func(s *corev1.Service) {
		s.Annotations = map[string]string{annotationGatewayAddress: "gw.example.com:443"}
	})
	setIngress("ovr", corev1.LoadBalancerIngress{IP: "198.51.100.9"})
	npPort, nplPort := uint32(np.Spec.Ports[0].NodePort), uint32(npl.Spec.Ports[0].NodePort)
	if npPort == 0 || nplPort == 0 {
		t.Fatalf("API server allocated no node ports: %d, %d", npPort, nplPort)
	}

	h := sdktest.Start(t, Factory)
	h.Configure(t, fmt.Sprintf("kubeconfig = %q\ncluster_id = \"c1\"\n", tb.Kubeconfig), sdk.MeshSettings{DomainSuffix: "cluster.local"})
	w := h.Watch(t)
	eu := sdk.Locality{Region: "eu"}
	gw := func(network, addr string, port uint32, loc sdk.Locality) sdk.NetworkGateway {
		return sdk.NetworkGateway{Network: network, Cluster: "c1", Address: addr, Port: port, Locality: loc}
	}
	waitGateways := func(what string, want []sdk.NetworkGateway, notices ...string) {
		t.Helper()
		w.WaitFor(t, waitTimeout, what, func(r *sdktest.Replica) bool {
			in := instance(r, "c1")
			if in == nil || !in.Synced || !slices.Equal(in.Gateways, want) {
				return false
			}
			for i := 0; i < len(notices); i += 2 {
				if !hasNotice(in, notices[i], notices[i+1]) {
					return false
				}
			}
			return true
		})
	}
	subject := func(name string) string { return "service " + ns + "/" + name }
	waitGateways("every kind of gateway", []sdk.NetworkGateway{
		gw("net-ext", "192.0.2.10", 16443, sdk.Locality{}),
		gw("net-lb", "198.51.100.1", 15443, sdk.Locality{}),
		gw("net-local", "203.0.113.2", nplPort, sdk.Locality{}),
		gw("net-np", "203.0.113.1", npPort, eu),
		gw("net-np", "203.0.113.2", npPort, sdk.Locality{}),
		gw("net-ovr", "gw.example.com", 443, sdk.Locality{}),
	},
		subject("np"), "node n3 dropped: it has no ExternalIP address",
		subject("npl"), "node n1 (203.0.113.1) dropped: externalTrafficPolicy is Local",
		subject("ovr"), "address 198.51.100.9 dropped: replaced by the estuary.io/gateway-address annotation",
	)

	// A node gains an ExternalIP; a Local gateway gains a ready endpoint;
	// a LoadBalancer stops being a gateway.
	k.updateNode("n3", func(n *corev1.Node) {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "203.0.113.3"}}
	})
	k.updateSlice(ns, "npl-1", func(s *discoveryv1.EndpointSlice) { s.Endpoints[1].Conditions.Ready = ready(true) })
	k.updateService(ns, "lb", func(s *corev1.Service) { delete(s.Labels, istio.LabelNetwork) })
	waitGateways("gateways after node, endpoint and service changes", []sdk.NetworkGateway{
		gw("net-ext", "192.0.2.10", 16443, sdk.Locality{}),
		gw("net-local", "203.0.113.1", nplPort, eu),
		gw("net-local", "203.0.113.2", nplPort, sdk.Locality{}),
		gw("net-np", "203.0.113.1", npPort, eu),
		gw("net-np", "203.0.113.2", npPort, sdk.Locality{}),
		gw("net-np", "203.0.113.3", npPort, sdk.Locality{}),
		gw("net-ovr", "gw.example.com", 443, sdk.Locality{}),
	},
		subject("npl"), "node n3 (203.0.113.3) dropped: externalTrafficPolicy is Local",
	)
}
