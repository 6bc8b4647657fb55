package istio

import "testing"

// The cases below restate Istio's own tests (pkg/config/protocol
// TestParse, pkg/config/kube TestConvertProtocol) and the behaviour of
// the code they test; each comment gives Istio's verdict.

func TestParseProtocol(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Protocol
	}{
		{"tcp", TCP},                         // Istio: TCP
		{"http", HTTP},                       // Istio: HTTP
		{"HTTP", HTTP},                       // Istio: HTTP (case is ignored)
		{"Http", HTTP},                       // Istio: HTTP
		{"https", HTTPS},                     // Istio: HTTPS
		{"http2", HTTP2},                     // Istio: HTTP2
		{"grpc", GRPC},                       // Istio: GRPC
		{"grpc-web", GRPCWeb},                // Istio: GRPC-Web
		{"gRPC-Web", GRPCWeb},                // Istio: GRPC-Web
		{"grpc-Web", GRPCWeb},                // Istio: GRPC-Web
		{"udp", UDP},                         // Istio: UDP
		{"Mongo", Mongo},                     // Istio: Mongo
		{"mongo", Mongo},                     // Istio: Mongo
		{"MONGO", Mongo},                     // Istio: Mongo
		{"Redis", Redis},                     // Istio: Redis
		{"redis", Redis},                     // Istio: Redis
		{"REDIS", Redis},                     // Istio: Redis
		{"Mysql", MySQL},                     // Istio: MySQL
		{"mysql", MySQL},                     // Istio: MySQL
		{"MYSQL", MySQL},                     // Istio: MySQL
		{"MySQL", MySQL},                     // Istio: MySQL
		{"", Unsupported},                    // Istio: UnsupportedProtocol
		{"SMTP", Unsupported},                // Istio: UnsupportedProtocol
		{"http_proxy", HTTPProxy},            // Istio: HTTP_PROXY
		{"HTTP_PROXY", HTTPProxy},            // Istio: HTTP_PROXY
		{"tls", TLS},                         // Istio: TLS
		{"http-web", Unsupported},            // Istio: UnsupportedProtocol (Parse takes whole names only)
		{"grpc-web-x", Unsupported},          // Istio: UnsupportedProtocol (idem)
		{" http", Unsupported},               // Istio: UnsupportedProtocol (no trimming)
		{"UnsupportedProtocol", Unsupported}, // Istio: UnsupportedProtocol
	} {
		if got := ParseProtocol(tc.in); got != tc.want {
			t.Errorf("ParseProtocol(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func ptr(s string) *string { return &s }

func TestServicePortProtocol(t *testing.T) {
	for _, tc := range []struct {
		name string
		port ServicePort
		want Protocol
	}{
		// From Istio's TestConvertProtocol.
		{"resolves empty", ServicePort{}, Unsupported},                                                            // Istio: UnsupportedProtocol
		{"resolves from protocol directly", ServicePort{Transport: "UDP"}, UDP},                                   // Istio: UDP
		{"resolves from port name", ServicePort{Name: "http-something"}, HTTP},                                    // Istio: HTTP
		{"prefers appProto over portName", ServicePort{Name: "http-something", AppProtocol: ptr("https")}, HTTPS}, // Istio: HTTPS
		{"resolves from appProto", ServicePort{Name: "something-httpx", AppProtocol: ptr("https")}, HTTPS},        // Istio: HTTPS
		{"resolves grpc-web", ServicePort{Name: "grpc-web-x"}, GRPCWeb},                                           // Istio: GRPC-Web
		{"grpc-web is not resolved incorrectly", ServicePort{Name: "grpcweb-x"}, Unsupported},                     // Istio: UnsupportedProtocol
		{"resolves based on known ports", ServicePort{Number: 3306, Name: "random-name"}, TCP},                    // Istio: TCP

		// The rest follow ConvertProtocol's code path by path.
		{"UDP wins over the name", ServicePort{Transport: "UDP", Name: "http"}, UDP},                                           // Istio: UDP
		{"UDP wins over appProtocol", ServicePort{Transport: "UDP", AppProtocol: ptr("http")}, UDP},                            // Istio: UDP
		{"SCTP port named by its name", ServicePort{Transport: "SCTP", Name: "http"}, HTTP},                                    // Istio: HTTP (only UDP is special)
		{"grpc-web alone", ServicePort{Name: "grpc-web"}, GRPCWeb},                                                             // Istio: GRPC-Web
		{"grpc-web prefix ignores case", ServicePort{Name: "GRPC-Web-admin"}, GRPCWeb},                                         // Istio: GRPC-Web
		{"grpc-webx has no '-' after the prefix", ServicePort{Name: "grpc-webx"}, GRPCWeb},                                     // Istio: GRPC-Web (a prefix match)
		{"grpc prefix", ServicePort{Name: "grpc-api"}, GRPC},                                                                   // Istio: GRPC
		{"http2 prefix", ServicePort{Name: "http2-api"}, HTTP2},                                                                // Istio: HTTP2
		{"http_proxy name", ServicePort{Name: "http_proxy"}, HTTPProxy},                                                        // Istio: HTTP_PROXY
		{"http_proxy prefix", ServicePort{Name: "http_proxy-egress"}, HTTPProxy},                                               // Istio: HTTP_PROXY
		{"prefix ignores case", ServicePort{Name: "HTTPS-admin"}, HTTPS},                                                       // Istio: HTTPS
		{"only the first '-' splits", ServicePort{Name: "tls-a-b"}, TLS},                                                       // Istio: TLS
		{"udp prefix on a TCP port", ServicePort{Name: "udp-dns"}, UDP},                                                        // Istio: UDP (the name decides)
		{"unknown name", ServicePort{Name: "web"}, Unsupported},                                                                // Istio: UnsupportedProtocol
		{"unknown prefix", ServicePort{Name: "web-http"}, Unsupported},                                                         // Istio: UnsupportedProtocol (suffix ignored)
		{"leading '-'", ServicePort{Name: "-http"}, Unsupported},                                                               // Istio: UnsupportedProtocol (empty prefix)
		{"well-known SMTP", ServicePort{Number: 25}, TCP},                                                                      // Istio: TCP
		{"well-known DNS", ServicePort{Number: 53, Name: "dns"}, TCP},                                                          // Istio: TCP
		{"well-known MongoDB", ServicePort{Number: 27017}, TCP},                                                                // Istio: TCP
		{"well-known port keeps a known name", ServicePort{Number: 3306, Name: "mysql"}, MySQL},                                // Istio: MySQL
		{"other port stays unsupported", ServicePort{Number: 8080, Name: "web"}, Unsupported},                                  // Istio: UnsupportedProtocol
		{"appProtocol kubernetes.io/h2c", ServicePort{Name: "http", AppProtocol: ptr("kubernetes.io/h2c")}, HTTP2},             // Istio: HTTP2
		{"appProtocol kubernetes.io/ws", ServicePort{AppProtocol: ptr("kubernetes.io/ws")}, HTTP},                              // Istio: HTTP
		{"appProtocol kubernetes.io/wss", ServicePort{AppProtocol: ptr("kubernetes.io/wss")}, HTTPS},                           // Istio: HTTPS
		{"Kubernetes names are case sensitive", ServicePort{AppProtocol: ptr("Kubernetes.io/h2c")}, Unsupported},               // Istio: UnsupportedProtocol
		{"appProtocol follows the naming rule", ServicePort{AppProtocol: ptr("grpc-web-x")}, GRPCWeb},                          // Istio: GRPC-Web
		{"appProtocol prefix", ServicePort{AppProtocol: ptr("http-v1")}, HTTP},                                                 // Istio: HTTP
		{"unknown appProtocol hides the name", ServicePort{Name: "http", AppProtocol: ptr("example.com/custom")}, Unsupported}, // Istio: UnsupportedProtocol
		{"empty appProtocol hides the name", ServicePort{Name: "http", AppProtocol: ptr("")}, Unsupported},                     // Istio: UnsupportedProtocol
		{"unknown appProtocol on a well-known port", ServicePort{Number: 53, AppProtocol: ptr("dns")}, TCP},                    // Istio: TCP
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.port.Protocol(); got != tc.want {
				t.Errorf("%+v.Protocol() = %q, want %q", tc.port, got, tc.want)
			}
		})
	}
}

func TestPortNameProtocol(t *testing.T) {
	// The port-naming rule alone: no port number, no transport.
	for _, tc := range []struct {
		name string
		want Protocol
	}{
		{"http", HTTP},             // Istio: HTTP
		{"http-web", HTTP},         // Istio: HTTP
		{"grpc-web-x", GRPCWeb},    // Istio: GRPC-Web
		{"grpcweb-x", Unsupported}, // Istio: UnsupportedProtocol
		{"http_proxy", HTTPProxy},  // Istio: HTTP_PROXY
		{"mongo-primary", Mongo},   // Istio: Mongo
		{"redis", Redis},           // Istio: Redis
		{"", Unsupported},          // Istio: UnsupportedProtocol
	} {
		if got := PortNameProtocol(tc.name); got != tc.want {
			t.Errorf("PortNameProtocol(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestOrTCP(t *testing.T) {
	for _, tc := range []struct{ in, want Protocol }{
		{Unsupported, TCP},
		{"", TCP},
		{HTTP, HTTP},
		{UDP, UDP},
	} {
		if got := tc.in.OrTCP(); got != tc.want {
			t.Errorf("%q.OrTCP() = %q, want %q", tc.in, got, tc.want)
		}
	}
}
