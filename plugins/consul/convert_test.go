package consul

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/consul/api"

	"github.com/estuary-mesh/estuary/sdk"
)

var testOpts = convertOptions{datacenter: "dc1", domainSuffix: "service.consul", namespace: "default"}

// inst builds a health entry: an instance of s (service "web" by default)
// on a node, with one check per status given.
func inst(node, nodeAddr string, s api.AgentService, status ...string) *api.ServiceEntry {
	if s.Service == "" {
		s.Service = "web"
	}
	if s.ID == "" {
		s.ID = s.Service + "-" + node
	}
	if s.Weights == (api.AgentWeights{}) {
		s.Weights = api.AgentWeights{Passing: 1, Warning: 1}
	}
	e := &api.ServiceEntry{Node: &api.Node{Node: node, Address: nodeAddr, Datacenter: "dc1"}, Service: &s}
	for i, st := range status {
		e.Checks = append(e.Checks, &api.HealthCheck{Node: node, CheckID: "check" + string(rune('a'+i)), Status: st, ServiceID: s.ID})
	}
	return e
}

func withNodeMeta(e *api.ServiceEntry, meta map[string]string) *api.ServiceEntry {
	e.Node.Meta = meta
	return e
}

func svc(ports []sdk.Port, labels map[string]string) *sdk.Service {
	return &sdk.Service{Hostname: "web.service.consul", Namespace: "default", Name: "web", Ports: ports, Labels: labels}
}

func ep(addr, node string, mod func(*sdk.Endpoint)) sdk.Endpoint {
	e := sdk.Endpoint{Address: addr, Locality: sdk.Locality{Region: "dc1"}, Weight: 1, WorkloadName: node + "/web-" + node}
	if mod != nil {
		mod(&e)
	}
	return e
}

func TestConvert(t *testing.T) {
	httpPort := []sdk.Port{{Name: "http", Number: 8080, Protocol: "HTTP"}}
	tcpPort := []sdk.Port{{Name: "tcp", Number: 8080, Protocol: "TCP"}}
	tests := []struct {
		name    string
		opts    *convertOptions
		entries []*api.ServiceEntry
		want    view
		// notice, if set, must appear in one of the notices.
		notice string
	}{
		{
			name:    "no instances",
			entries: nil,
			want:    view{},
		},
		{
			name: "connect proxies are not services",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Kind: api.ServiceKindConnectProxy, Port: 21000}, "passing"),
			},
			want: view{},
		},
		{
			name: "default protocol is TCP; address falls back to the node's",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080}),
			},
			want: view{service: svc(tcpPort, nil), endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", nil)}},
		},
		{
			name: "service address wins over the node's; protocol from a plain tag",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Address: "10.1.1.1", Tags: []string{"http"}}, "passing"),
			},
			want: view{
				service:   svc(httpPort, map[string]string{"http": "true"}),
				endpoints: []sdk.Endpoint{ep("10.1.1.1", "n1", func(e *sdk.Endpoint) { e.Labels = map[string]string{"http": "true"} })},
			},
		},
		{
			name: "protocol meta wins over a tag",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 9000, Tags: []string{"http"}, Meta: map[string]string{"protocol": "gRPC"}}),
			},
			want: view{
				service: svc([]sdk.Port{{Name: "grpc", Number: 9000, Protocol: "GRPC"}}, map[string]string{"http": "true", "protocol": "gRPC"}),
				endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", func(e *sdk.Endpoint) {
					e.Labels = map[string]string{"http": "true", "protocol": "gRPC"}
				})},
			},
		},
		{
			name: "protocol=... tag",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 9000, Tags: []string{"protocol=http2"}}),
			},
			want: view{
				service:   svc([]sdk.Port{{Name: "http2", Number: 9000, Protocol: "HTTP2"}}, map[string]string{"protocol": "http2"}),
				endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", func(e *sdk.Endpoint) { e.Labels = map[string]string{"protocol": "http2"} })},
			},
		},
		{
			name: "unknown protocol is TCP, with a notice",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 9000, Meta: map[string]string{"protocol": "quic"}}),
			},
			want: view{
				service:   svc([]sdk.Port{{Name: "tcp", Number: 9000, Protocol: "TCP"}}, map[string]string{"protocol": "quic"}),
				endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", func(e *sdk.Endpoint) { e.Labels = map[string]string{"protocol": "quic"} })},
			},
			notice: `unknown protocol "quic"`,
		},
		{
			name: "tags and meta become labels; meta wins on a clash",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Tags: []string{"version=v1", "canary", "team=a", "=x"}, Meta: map[string]string{"team": "b"}}),
				inst("n2", "10.0.0.2", api.AgentService{Port: 8080, Tags: []string{"version=v2"}, Meta: map[string]string{"team": "b"}}),
			},
			want: view{
				service: svc(tcpPort, map[string]string{"team": "b"}),
				endpoints: []sdk.Endpoint{
					ep("10.0.0.1", "n1", func(e *sdk.Endpoint) {
						e.Labels = map[string]string{"version": "v1", "canary": "true", "team": "b"}
					}),
					ep("10.0.0.2", "n2", func(e *sdk.Endpoint) { e.Labels = map[string]string{"version": "v2", "team": "b"} }),
				},
			},
		},
		{
			name: "several ports through port_ meta, protocol from protocol_ meta or the name",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Meta: map[string]string{
					"protocol": "http", "port_admin": "9901", "protocol_admin": "http", "port_grpc-api": "9090", "port_metrics": "9102",
				}}),
			},
			want: view{
				service: svc([]sdk.Port{
					{Name: "admin", Number: 9901, Protocol: "HTTP"},
					{Name: "grpc-api", Number: 9090, Protocol: "GRPC"},
					{Name: "http", Number: 8080, Protocol: "HTTP"},
					{Name: "metrics", Number: 9102, Protocol: "TCP"},
				}, map[string]string{"protocol": "http", "port_admin": "9901", "protocol_admin": "http", "port_grpc-api": "9090", "port_metrics": "9102"}),
				endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", func(e *sdk.Endpoint) {
					e.Labels = map[string]string{"protocol": "http", "port_admin": "9901", "protocol_admin": "http", "port_grpc-api": "9090", "port_metrics": "9102"}
				})},
			},
		},
		{
			name: "Consul's multi-port list; a named port on the instance port hides the unnamed one",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Ports: api.ServicePorts{{Name: "http-web", Port: 8080, Default: true}, {Name: "grpc", Port: 9090}}}),
			},
			want: view{
				service:   svc([]sdk.Port{{Name: "grpc", Number: 9090, Protocol: "GRPC"}, {Name: "http-web", Number: 8080, Protocol: "HTTP"}}, nil),
				endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", nil)},
			},
		},
		{
			// The names the plugins' old protocol tables disagreed on: Istio
			// reads grpc-web-x as GRPC-Web and knows HTTP_PROXY.
			name: "port names follow Istio's rule",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Ports: api.ServicePorts{
					{Name: "grpc-web-x", Port: 8080}, {Name: "http_proxy", Port: 3128}, {Name: "grpcweb-x", Port: 9000},
				}}),
			},
			want: view{
				service: svc([]sdk.Port{
					{Name: "grpc-web-x", Number: 8080, Protocol: "GRPC-Web"},
					{Name: "grpcweb-x", Number: 9000, Protocol: "TCP"},
					{Name: "http_proxy", Number: 3128, Protocol: "HTTP_PROXY"},
				}, nil),
				endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", nil)},
			},
		},
		{
			name: "bad port_ meta is ignored with a notice",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Meta: map[string]string{"port_admin": "99999"}}),
			},
			want: view{
				service:   svc(tcpPort, map[string]string{"port_admin": "99999"}),
				endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", func(e *sdk.Endpoint) { e.Labels = map[string]string{"port_admin": "99999"} })},
			},
			notice: `meta port_admin = "99999" ignored`,
		},
		{
			name: "meta mtls_mode is the service's own mTLS mode; the first instance decides",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Meta: map[string]string{"mtls_mode": "DISABLE"}}),
				inst("n2", "10.0.0.2", api.AgentService{Port: 8080, Meta: map[string]string{"mtls_mode": "STRICT"}}),
			},
			want: view{
				service: func() *sdk.Service {
					s := svc(tcpPort, nil)
					s.MTLSMode, s.MTLSModeSource = sdk.MTLSModeDisable, "service meta mtls_mode"
					return s
				}(),
				endpoints: []sdk.Endpoint{
					ep("10.0.0.1", "n1", func(e *sdk.Endpoint) { e.Labels = map[string]string{"mtls_mode": "DISABLE"} }),
					ep("10.0.0.2", "n2", func(e *sdk.Endpoint) { e.Labels = map[string]string{"mtls_mode": "STRICT"} }),
				},
			},
			notice: `meta mtls_mode = "STRICT" ignored: instance n1/web-n1 says DISABLE first`,
		},
		{
			name: "a bad meta mtls_mode is ignored with a notice",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Meta: map[string]string{"mtls_mode": "on"}}),
			},
			want: view{
				service:   svc(tcpPort, map[string]string{"mtls_mode": "on"}),
				endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", func(e *sdk.Endpoint) { e.Labels = map[string]string{"mtls_mode": "on"} })},
			},
			notice: `meta mtls_mode = "on" ignored: want STRICT, PERMISSIVE or DISABLE`,
		},
		{
			name: "meta locality_failover is the service's own; the first instance decides",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Meta: map[string]string{"locality_failover": "false"}}),
				inst("n2", "10.0.0.2", api.AgentService{Port: 8080, Meta: map[string]string{"locality_failover": "true"}}),
			},
			want: view{
				service: func() *sdk.Service {
					s := svc(tcpPort, nil)
					s.LocalityFailover = sdk.LocalityFailoverOff
					return s
				}(),
				endpoints: []sdk.Endpoint{
					ep("10.0.0.1", "n1", func(e *sdk.Endpoint) { e.Labels = map[string]string{"locality_failover": "false"} }),
					ep("10.0.0.2", "n2", func(e *sdk.Endpoint) { e.Labels = map[string]string{"locality_failover": "true"} }),
				},
			},
			notice: `meta locality_failover = "true" ignored: instance n1/web-n1 says off first`,
		},
		{
			name: "a bad meta locality_failover is ignored with a notice",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Meta: map[string]string{"locality_failover": "yes"}}),
			},
			want: view{
				service:   svc(tcpPort, map[string]string{"locality_failover": "yes"}),
				endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", func(e *sdk.Endpoint) { e.Labels = map[string]string{"locality_failover": "yes"} })},
			},
			notice: `meta locality_failover = "yes" ignored: want "true" or "false"`,
		},
		{
			name: "instances on different numbers: most common wins, the others get target ports",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080}),
				inst("n2", "10.0.0.2", api.AgentService{Port: 8080}),
				inst("n3", "10.0.0.3", api.AgentService{Port: 18080}),
			},
			want: view{
				service: svc(tcpPort, nil),
				endpoints: []sdk.Endpoint{
					ep("10.0.0.1", "n1", nil), ep("10.0.0.2", "n2", nil),
					ep("10.0.0.3", "n3", func(e *sdk.Endpoint) { e.TargetPorts = map[string]uint32{"tcp": 18080} }),
				},
			},
		},
		{
			name: "an instance lacking a port gets a notice",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Meta: map[string]string{"port_admin": "9901"}}),
				inst("n2", "10.0.0.2", api.AgentService{Port: 8080}),
			},
			want: view{
				service: svc([]sdk.Port{{Name: "admin", Number: 9901, Protocol: "TCP"}, {Name: "tcp", Number: 8080, Protocol: "TCP"}}, nil),
				endpoints: []sdk.Endpoint{
					ep("10.0.0.1", "n1", func(e *sdk.Endpoint) { e.Labels = map[string]string{"port_admin": "9901"} }),
					ep("10.0.0.2", "n2", nil),
				},
			},
			notice: `lacks port "admin"`,
		},
		{
			name: "two names on one number: the second is dropped",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Meta: map[string]string{"port_a": "9000", "port_b": "9000"}}),
			},
			want: view{
				service: svc([]sdk.Port{{Name: "a", Number: 9000, Protocol: "TCP"}}, map[string]string{"port_a": "9000", "port_b": "9000"}),
				endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", func(e *sdk.Endpoint) {
					e.Labels = map[string]string{"port_a": "9000", "port_b": "9000"}
				})},
			},
			notice: `"b" is dropped`,
		},
		{
			name: "critical and maintenance instances leave the endpoints, not the ports",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080}, "passing"),
				inst("n2", "10.0.0.2", api.AgentService{Port: 8080}, "passing", "critical"),
				inst("n3", "10.0.0.3", api.AgentService{Port: 8080}, "warning"),
				func() *api.ServiceEntry {
					e := inst("n4", "10.0.0.4", api.AgentService{Port: 8080}, "passing")
					e.Checks = append(e.Checks, &api.HealthCheck{CheckID: api.NodeMaint, Status: "critical"})
					return e
				}(),
			},
			want: view{service: svc(tcpPort, nil), endpoints: []sdk.Endpoint{ep("10.0.0.1", "n1", nil)}},
		},
		{
			name: "all instances critical: the service stays, with no endpoints",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080}, "critical"),
			},
			want: view{service: svc(tcpPort, nil)},
		},
		{
			name: "passing_and_warning: warning instances with their warning weight; weight 0 means no traffic",
			opts: &convertOptions{datacenter: "dc1", domainSuffix: "service.consul", namespace: "default", warning: true},
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Weights: api.AgentWeights{Passing: 10, Warning: 2}}, "passing"),
				inst("n2", "10.0.0.2", api.AgentService{Port: 8080, Weights: api.AgentWeights{Passing: 10, Warning: 2}}, "warning"),
				inst("n3", "10.0.0.3", api.AgentService{Port: 8080, Weights: api.AgentWeights{Passing: 10, Warning: 0}}, "warning"),
				inst("n4", "10.0.0.4", api.AgentService{Port: 8080}, "critical"),
			},
			want: view{service: svc(tcpPort, nil), endpoints: []sdk.Endpoint{
				ep("10.0.0.1", "n1", func(e *sdk.Endpoint) { e.Weight = 10 }),
				ep("10.0.0.2", "n2", func(e *sdk.Endpoint) { e.Weight = 2 }),
			}},
		},
		{
			name: "locality, network and TLS mode",
			entries: []*api.ServiceEntry{
				withNodeMeta(inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Meta: map[string]string{"tls_mode": "istio"}}),
					map[string]string{"zone": "us-east-1a", "network": "net-node"}),
				withNodeMeta(inst("n2", "10.0.0.2", api.AgentService{Port: 8080, Tags: []string{"security.istio.io/tlsMode=istio"}, Meta: map[string]string{"network": "net-svc"}}),
					map[string]string{"network": "net-node"}),
				inst("n3", "10.0.0.3", api.AgentService{Port: 8080, Locality: &api.Locality{Region: "us-east-1", Zone: "us-east-1c"}}),
			},
			want: view{service: svc(tcpPort, nil), endpoints: []sdk.Endpoint{
				ep("10.0.0.1", "n1", func(e *sdk.Endpoint) {
					e.Labels = map[string]string{"tls_mode": "istio"}
					e.Locality.Zone, e.Network, e.TLSMode = "us-east-1a", "net-node", sdk.TLSModeIstio
				}),
				ep("10.0.0.2", "n2", func(e *sdk.Endpoint) {
					e.Labels = map[string]string{"security.istio.io/tlsMode": "istio", "network": "net-svc"}
					e.Network, e.TLSMode = "net-svc", sdk.TLSModeIstio
				}),
				ep("10.0.0.3", "n3", func(e *sdk.Endpoint) { e.Locality.Zone = "us-east-1c" }),
			}},
		},
		{
			name: "host names as addresses make the service DNS-resolved",
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Port: 443, Address: "api.example.com"}),
			},
			want: view{
				service: func() *sdk.Service {
					s := svc([]sdk.Port{{Name: "tcp", Number: 443, Protocol: "TCP"}}, nil)
					s.Resolution = sdk.ResolutionDNS
					return s
				}(),
				endpoints: []sdk.Endpoint{ep("api.example.com", "n1", nil)},
			},
		},
		{
			name: "virtual IP; hostname is lower case with the configured suffix",
			opts: &convertOptions{datacenter: "dc1", domainSuffix: "consul.example", namespace: "team-a"},
			entries: []*api.ServiceEntry{
				inst("n1", "10.0.0.1", api.AgentService{Service: "Web", Port: 8080, TaggedAddresses: map[string]api.ServiceAddress{"consul-virtual": {Address: "240.0.0.3", Port: 8080}}}),
			},
			want: view{
				service: &sdk.Service{
					Hostname: "web.consul.example", Namespace: "team-a", Name: "Web", Ports: tcpPort,
					VIPs: map[string][]string{"dc1": {"240.0.0.3"}},
				},
				endpoints: []sdk.Endpoint{{Address: "10.0.0.1", Locality: sdk.Locality{Region: "dc1"}, Weight: 1, WorkloadName: "n1/Web-n1"}},
			},
		},
		{
			name: "network gateways: WAN address, gateway port, defaults; unhealthy ones are not gateways",
			entries: []*api.ServiceEntry{
				withNodeMeta(inst("n1", "10.0.0.1", api.AgentService{Port: 8443, Meta: map[string]string{"network_gateway": "net2"},
					TaggedAddresses: map[string]api.ServiceAddress{"wan": {Address: "203.0.113.1", Port: 15443}}}, "passing"), map[string]string{"zone": "z1"}),
				inst("n2", "10.0.0.2", api.AgentService{Port: 8443, Tags: []string{"estuary.io/network-gateway=net2", "networking.istio.io/gatewayPort=16443"}}),
				inst("n3", "10.0.0.3", api.AgentService{Port: 8443, Meta: map[string]string{"network_gateway": "net2"}}, "critical"),
				inst("n4", "10.0.0.4", api.AgentService{Meta: map[string]string{"network_gateway": "net3", "port_tls": "8443"}}),
				inst("n5", "10.0.0.5", api.AgentService{Port: 8443, Meta: map[string]string{"network_gateway": "net3", "gateway_port": "x"}}),
			},
			want: view{
				service: svc([]sdk.Port{{Name: "tcp", Number: 8443, Protocol: "TCP"}}, nil),
				endpoints: []sdk.Endpoint{
					ep("10.0.0.1", "n1", func(e *sdk.Endpoint) {
						e.Labels = map[string]string{"network_gateway": "net2"}
						e.Locality.Zone = "z1"
					}),
					ep("10.0.0.2", "n2", func(e *sdk.Endpoint) {
						e.Labels = map[string]string{"estuary.io/network-gateway": "net2", "networking.istio.io/gatewayPort": "16443"}
					}),
					ep("10.0.0.4", "n4", func(e *sdk.Endpoint) {
						e.Labels = map[string]string{"network_gateway": "net3", "port_tls": "8443"}
					}),
					ep("10.0.0.5", "n5", func(e *sdk.Endpoint) {
						e.Labels = map[string]string{"network_gateway": "net3", "gateway_port": "x"}
					}),
				},
				gateways: []sdk.NetworkGateway{
					{Network: "net2", Cluster: "dc1", Address: "10.0.0.2", Port: 16443, Locality: sdk.Locality{Region: "dc1"}},
					{Network: "net2", Cluster: "dc1", Address: "203.0.113.1", Port: 15443, Locality: sdk.Locality{Region: "dc1", Zone: "z1"}},
					{Network: "net3", Cluster: "dc1", Address: "10.0.0.4", Port: 15443, Locality: sdk.Locality{Region: "dc1"}},
					{Network: "net3", Cluster: "dc1", Address: "10.0.0.5", Port: 8443, Locality: sdk.Locality{Region: "dc1"}},
				},
			},
			notice: `gateway port "x"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOpts
			if tt.opts != nil {
				o = *tt.opts
			}
			got := convert(firstService(tt.entries), tt.entries, o)
			notices := got.notices
			got.notices = nil
			if diff := cmp.Diff(tt.want, got, cmpView); diff != "" {
				t.Errorf("convert (-want +got):\n%s", diff)
			}
			if !got.equal(&tt.want) {
				t.Errorf("view.equal says the views differ")
			}
			found := tt.notice == ""
			for _, n := range notices {
				if tt.notice != "" && strings.Contains(n.Message, tt.notice) {
					found = true
				}
				if !strings.HasPrefix(n.Subject, "service ") {
					t.Errorf("notice subject %q does not name the service", n.Subject)
				}
			}
			if !found {
				t.Errorf("notices %+v lack %q", notices, tt.notice)
			}
			if tt.notice == "" && len(notices) > 0 {
				t.Errorf("unexpected notices: %+v", notices)
			}
		})
	}
}

// plainService and plainEndpoint drop the SDK types' Equal methods, so cmp
// shows field-by-field differences.
type (
	plainService  sdk.Service
	plainEndpoint sdk.Endpoint
)

var cmpView = cmp.Options{
	cmp.AllowUnexported(view{}),
	cmp.Transformer("service", func(s *sdk.Service) *plainService { return (*plainService)(s) }),
	cmp.Transformer("endpoints", func(eps []sdk.Endpoint) []plainEndpoint {
		out := make([]plainEndpoint, len(eps))
		for i, e := range eps {
			out[i] = plainEndpoint(e)
		}
		return out
	}),
}

func firstService(entries []*api.ServiceEntry) string {
	if len(entries) == 0 {
		return "web"
	}
	return entries[0].Service.Service
}

// TestConvertIsDeterministic: the same data in another order gives an equal
// view, so a blocking query that returns unchanged data emits nothing.
func TestConvertIsDeterministic(t *testing.T) {
	a := []*api.ServiceEntry{
		inst("n1", "10.0.0.1", api.AgentService{Port: 8080, Meta: map[string]string{"port_x": "1", "port_y": "2"}}),
		inst("n2", "10.0.0.2", api.AgentService{Port: 8081, Tags: []string{"grpc"}}),
		inst("n3", "10.0.0.3", api.AgentService{Port: 8081, Meta: map[string]string{"protocol": "nope", "network_gateway": "n"}}),
	}
	b := []*api.ServiceEntry{a[2], a[0], a[1]}
	va, vb := convert("web", a, testOpts), convert("web", b, testOpts)
	if !va.equal(&vb) {
		t.Errorf("views of the same entries in another order differ:\n%s", cmp.Diff(va, vb, cmpView))
	}
	vb.endpoints[0].Weight++
	if va.equal(&vb) {
		t.Errorf("equal ignores an endpoint's weight")
	}
}

func TestNoticesAreBounded(t *testing.T) {
	var entries []*api.ServiceEntry
	for i := range 50 {
		entries = append(entries, inst("n"+string(rune('A'+i)), "10.0.0.1", api.AgentService{Port: 8080, Meta: map[string]string{"protocol": "bogus"}}))
	}
	v := convert("web", entries, testOpts)
	if len(v.notices) != maxNoticesPerService+1 {
		t.Fatalf("got %d notices, want %d plus a summary", len(v.notices), maxNoticesPerService)
	}
	if last := v.notices[len(v.notices)-1]; last.Message != "and 40 more not shown" {
		t.Errorf("summary notice = %+v", last)
	}
}
