package serviceentry

import (
	"fmt"
	"strings"
	"testing"
)

// parityCase is one object and the verdict Istio's validation (the
// webhook's ValidateServiceEntry and ValidateWorkloadEntry, and the CRD
// schema) gives it. The cases restate, in YAML of our own, those of
// Istio's validation tests (pilot/pkg/config/validation) for both kinds,
// plus Istio's documented examples.
type parityCase struct {
	name  string
	kind  string // "ServiceEntry" or "WorkloadEntry"
	spec  string // the spec, indented by two spaces
	istio bool   // Istio accepts it
	// differs, when set, says why Estuary deliberately gives the other
	// verdict (also written in the plugin's README).
	differs string
}

var parityCases = []parityCase{
	// Resolution DNS.
	{name: "DNS: wildcard host, host-name endpoints mapping declared ports", kind: "ServiceEntry", istio: true, spec: `
  hosts: ["*.example.com"]
  ports: [{number: 80, protocol: http, name: http-a}, {number: 8080, protocol: http, name: http-b}]
  resolution: DNS
  endpoints: [{address: eu.example.com, ports: {http-a: 8080}}, {address: us.example.com, ports: {http-b: 9080}}]`},
	{name: "DNS: an IP and a host name as endpoints", kind: "ServiceEntry", istio: true, spec: `
  hosts: ["*.example.com"]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS
  endpoints: [{address: 1.1.1.1}, {address: us.example.com}]`},
	{name: "DNS: no hosts", kind: "ServiceEntry", istio: false, spec: `
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS
  endpoints: [{address: us.example.com}]`},
	{name: "DNS: host that is not a DNS name", kind: "ServiceEntry", istio: false, spec: `
  hosts: ["-"]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS
  endpoints: [{address: us.example.com}]`},
	{name: "DNS: the full wildcard among the hosts", kind: "ServiceEntry", istio: false, spec: `
  hosts: [foo.com, "*"]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS
  endpoints: [{address: us.example.com}]`},
	{name: "DNS: a short host name", kind: "ServiceEntry", istio: true, spec: `
  hosts: [foo, bar.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS
  endpoints: [{address: us.example.com, ports: {http-a: 9080}}]`},
	{name: "DNS: endpoint maps a port the entry does not declare", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS
  endpoints: [{address: eu.example.com, ports: {http-a: 8080}}, {address: us.example.com, ports: {http-missing: 9080}}]`},
	{name: "DNS: wildcard endpoint address", kind: "ServiceEntry", istio: false, spec: `
  hosts: ["*.example.com"]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS
  endpoints: [{address: "*.eu.example.com"}]`},
	{name: "DNS: wildcard host and no endpoints", kind: "ServiceEntry", istio: false, spec: `
  hosts: ["*.example.com"]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS`},
	{name: "DNS: wildcard host, a workload selector and no endpoints", kind: "ServiceEntry", istio: false, spec: `
  hosts: ["*.example.com"]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS
  workloadSelector: {labels: {app: a}}`},
	{name: "DNS: a plain host and no endpoints", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}, {number: 8080, protocol: http, name: http-b}]
  resolution: DNS`},
	{name: "DNS: unix socket endpoint", kind: "ServiceEntry", istio: false, spec: `
  hosts: ["*.example.com"]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS
  endpoints: [{address: "unix:///run/a.sock"}]`},
	{name: "DNS: CIDR address", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  addresses: [10.0.0.0/8]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS`},
	{name: "DNS_ROUND_ROBIN: one endpoint", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS_ROUND_ROBIN
  endpoints: [{address: eu.example.com}]`},
	{name: "DNS_ROUND_ROBIN: two endpoints", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS_ROUND_ROBIN
  endpoints: [{address: eu.example.com}, {address: us.example.com}]`},
	{name: "DNS: network-only endpoint", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DNS
  endpoints: [{network: network2}]`,
		differs: "a DNS cluster carries addresses to resolve; a network-only endpoint needs resolution STATIC"},
	{name: "DYNAMIC_DNS: wildcard host", kind: "ServiceEntry", istio: true, spec: `
  hosts: ["*.example.com"]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: DYNAMIC_DNS`,
		differs: "DYNAMIC_DNS needs Envoy's dynamic forward proxy, which Estuary does not configure"},

	// Resolution NONE.
	{name: "NONE: no endpoints", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}, {number: 8080, protocol: http, name: http-b}]
  resolution: NONE`},
	{name: "NONE: endpoints given", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: NONE
  endpoints: [{address: eu.example.com, ports: {http-a: 8080}}]`},
	{name: "NONE: CIDR with host bits set", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  addresses: [172.1.2.16/16]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: NONE`},
	{name: "NONE: two ports with one name", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-same}, {number: 8080, protocol: http, name: http-same}]
  resolution: NONE`},
	{name: "NONE: two ports with one number", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}, {number: 80, protocol: http, name: http-b}]
  resolution: NONE`},

	// Resolution STATIC.
	{name: "STATIC: CIDR address and IP endpoints", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  addresses: [172.1.2.16/16]
  ports: [{number: 80, protocol: http, name: http-a}, {number: 8080, protocol: http, name: http-b}]
  resolution: STATIC
  endpoints: [{address: 1.1.1.1, ports: {http-a: 8080}}, {address: 2.2.2.2, ports: {http-b: 9080}}]`},
	{name: "STATIC: Istio's external-svc-mongocluster (MESH_INTERNAL, CIDR, MONGO)", kind: "ServiceEntry", istio: true, spec: `
  hosts: [mymongodb.somedomain]
  addresses: [192.192.192.192/24]
  ports: [{number: 27018, name: mongodb, protocol: MONGO}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{address: 2.2.2.2}, {address: 3.3.3.3}]`},
	{name: "STATIC: CIDR address on an HTTP MESH_EXTERNAL entry", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  addresses: [10.0.0.0/8]
  ports: [{number: 80, protocol: HTTP, name: http}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{address: 10.1.1.1}]`},
	{name: "STATIC: a VIP and IP endpoints", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  addresses: [172.1.2.16]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: STATIC
  endpoints: [{address: 1.1.1.1, ports: {http-a: 8080}}, {address: 2.2.2.2}]`},
	{name: "STATIC: IPv6 VIP, CIDR and endpoint", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  addresses: ["2001:db8::1", "2001:db8:1::/48"]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: STATIC
  endpoints: [{address: "2001:db8::10"}]`},
	{name: "STATIC: a host name endpoint", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: STATIC
  endpoints: [{address: example.com}, {address: 2.2.2.2}]`},
	{name: "STATIC: no endpoints", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  addresses: [172.1.2.16]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: STATIC`},
	{name: "STATIC: endpoint maps a port the entry does not declare", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: STATIC
  endpoints: [{address: 1.1.1.1, ports: {http-a: 8080}}, {address: 2.2.2.2, ports: {http-missing: 9080}}]`},
	{name: "STATIC: network-only endpoint", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: STATIC
  endpoints: [{address: 1.1.1.1}, {network: network2}]`},
	{name: "STATIC: endpoint with neither address nor network", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: STATIC
  endpoints: [{labels: {app: a}}]`},
	{name: "STATIC: endpoint label key that is not a label key", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: STATIC
  endpoints: [{address: 1.1.1.1, labels: {"not a key": a}}]`},
	{name: "STATIC: unix socket, one port", kind: "ServiceEntry", istio: true, spec: `
  hosts: [uds.example.com]
  ports: [{number: 6553, protocol: grpc, name: grpc-a}]
  resolution: STATIC
  endpoints: [{address: "unix:///path/to/socket"}]`},
	{name: "STATIC: unix socket, relative path", kind: "ServiceEntry", istio: false, spec: `
  hosts: [uds.example.com]
  ports: [{number: 6553, protocol: grpc, name: grpc-a}]
  resolution: STATIC
  endpoints: [{address: "unix://./relative/path.sock"}]`},
	{name: "STATIC: unix socket with endpoint ports", kind: "ServiceEntry", istio: false, spec: `
  hosts: [uds.example.com]
  ports: [{number: 6553, protocol: grpc, name: grpc-a}]
  resolution: STATIC
  endpoints: [{address: "unix:///path/to/socket", ports: {grpc-a: 6553}}]`},
	{name: "STATIC: unix socket, two service ports", kind: "ServiceEntry", istio: false, spec: `
  hosts: [uds.example.com]
  ports: [{number: 6553, protocol: grpc, name: grpc-a}, {number: 80, protocol: http, name: http-b}]
  resolution: STATIC
  endpoints: [{address: "unix:///path/to/socket"}]`},
	{name: "STATIC: workload selector and endpoints together", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: STATIC
  workloadSelector: {labels: {app: a}}
  endpoints: [{address: 1.1.1.1}]`},
	{name: "STATIC: workload selector with a wildcard value", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: STATIC
  workloadSelector: {labels: {app: "*"}}`},
	{name: "STATIC: workload selector", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  ports: [{number: 80, protocol: http, name: http-a}]
  resolution: STATIC
  workloadSelector: {labels: {app: a}}`},

	// Ports, addresses, hosts, exportTo.
	{name: "a port without protocol (sniffed)", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  ports: [{number: 80, name: a}]
  resolution: NONE`},
	{name: "an unknown protocol", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, name: a, protocol: QUIC}]
  resolution: NONE`},
	{name: "port number 0", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 0, name: a}]
  resolution: NONE`},
	{name: "target port out of range", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, name: a, targetPort: 70000}]
  resolution: NONE`},
	{name: "an address that is neither IP nor CIDR", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  addresses: [not-an-ip]
  ports: [{number: 80, name: a}]
  resolution: NONE`},
	{name: "a host listed twice", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com, example.com]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: NONE`},
	{name: "exportTo the own namespace", kind: "ServiceEntry", istio: true, spec: `
  hosts: [example.com]
  ports: [{number: 80, name: a}]
  resolution: NONE
  exportTo: ["."]`},
	{name: "exportTo everywhere and one namespace", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, name: a}]
  resolution: NONE
  exportTo: ["*", "."]`},
	{name: "exportTo a namespace twice", kind: "ServiceEntry", istio: false, spec: `
  hosts: [example.com]
  ports: [{number: 80, name: a}]
  resolution: NONE
  exportTo: [ns2, ns2]`},

	// WorkloadEntry on its own.
	{name: "WorkloadEntry: an IP", kind: "WorkloadEntry", istio: true, spec: `
  address: 2.3.4.5
  labels: {app: a}`},
	{name: "WorkloadEntry: a host name", kind: "WorkloadEntry", istio: true, spec: `
  address: vm1.example.com`},
	{name: "WorkloadEntry: neither address nor network", kind: "WorkloadEntry", istio: false, spec: `
  labels: {app: a}`},
	{name: "WorkloadEntry: network only", kind: "WorkloadEntry", istio: true, spec: `
  network: network2
  labels: {app: a}`},
	{name: "WorkloadEntry: unix socket", kind: "WorkloadEntry", istio: true, spec: `
  address: "unix:///run/app.sock"`},
	{name: "WorkloadEntry: unix socket, relative path", kind: "WorkloadEntry", istio: false, spec: `
  address: "unix://run/app.sock"`},
	{name: "WorkloadEntry: label key that is not a label key", kind: "WorkloadEntry", istio: false, spec: `
  address: 2.3.4.5
  labels: {"a/b/c": x}`},
	{name: "WorkloadEntry: port 0", kind: "WorkloadEntry", istio: false, spec: `
  address: 2.3.4.5
  ports: {http: 0}`},
}

// TestIstioValidationParity: Estuary accepts exactly the objects Istio's
// validation accepts, but where a case says why it deliberately differs.
func TestIstioValidationParity(t *testing.T) {
	if len(parityCases) < 40 {
		t.Fatalf("only %d cases", len(parityCases))
	}
	for _, c := range parityCases {
		t.Run(c.name, func(t *testing.T) {
			src := fmt.Sprintf("apiVersion: networking.istio.io/v1\nkind: %s\nmetadata: {name: x, namespace: ns1}\nspec:%s\n", c.kind, c.spec)
			docs := decodeFile("parity.yaml", []byte(src), "default")
			if len(docs) != 1 {
				t.Fatalf("decoded %d documents", len(docs))
			}
			accepted := docs[0].obj != nil
			want := c.istio
			if c.differs != "" {
				want = !want
			}
			if accepted != want {
				t.Errorf("Estuary accepted=%v, want %v (Istio: %v; differs: %q); errors: %v\n%s",
					accepted, want, c.istio, c.differs, docs[0].errs, strings.TrimSpace(src))
			}
		})
	}
}
