package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/testbed/certs"
)

// pki is a CA, the server's certificate files signed by it, and a
// second CA the server does not trust.
type pki struct {
	ca, other *certs.CA
	files     TLSFiles
	dir       string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{ca: certs.NewCA(t, "mesh-ca"), other: certs.NewCA(t, "other-ca"), dir: t.TempDir()}
	p.files.CertFile, p.files.KeyFile = p.ca.Server(t, "estuary-one").Write(t, p.dir, "server")
	p.files.ClientCAFile = filepath.Join(p.dir, "ca.crt")
	certs.WriteFile(t, p.files.ClientCAFile, p.ca.PEM)
	p.files.Poll = 20 * time.Millisecond
	return p
}

// startTLSServer serves the fixture's registry over TLS xDS with policy.
func startTLSServer(t *testing.T, f *fixture, p *pki, policy *Policy) (*Server, *prometheus.Registry, string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	files := p.files
	s := New(Options{Listen: "127.0.0.1:0", TLS: &files, Policy: policy}, f.agg, nil, f.agg, hclog.NewNullLogger(), reg)
	return s, reg, serve(t, s)
}

// tlsStream opens an ADS stream over TLS, trusting the mesh CA and
// presenting cert (none if nil).
func tlsStream(t *testing.T, addr string, roots *x509.CertPool, cert *certs.Pair) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	st, err := openTLS(t, addr, roots, cert)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// openTLS is tlsStream for a stream that may fail to open: a handshake
// the server refuses can fail it before any request.
func openTLS(t *testing.T, addr string, roots *x509.CertPool, cert *certs.Pair) (discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, error) {
	t.Helper()
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{cert.TLS(t)}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
}

// firstAnswer sends a CDS request for node and returns the first response
// or the error that ended the stream.
func firstAnswer(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient, node *corev3.Node) (*discoveryv3.DiscoveryResponse, error) {
	// Send reports only io.EOF when the stream already ended; Recv says why.
	_ = st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType})
	return st.Recv()
}

func istioNode(id string, md map[string]any) *corev3.Node {
	s, _ := structpb.NewStruct(md)
	return &corev3.Node{Id: id, Metadata: s}
}

const (
	gatewayID = "spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"
	sidecarNS = "sidecar~10.0.0.1~reviews-1.bookinfo~bookinfo.svc.cluster.local"
)

// TestTLSIdentityAuthorization: over TLS with client certificates, a node
// is served only if its certificate comes from the client CA, carries a
// SPIFFE ID, and the ID allows what the node claims; every refusal is
// PermissionDenied naming the claim and the identity, and is counted.
func TestTLSIdentityAuthorization(t *testing.T) {
	f := newFixture(t)
	f.populate(2, 1)
	p := newPKI(t)
	policy := &Policy{
		Routers:      []string{gatewayID},
		TrustDomains: map[string]TrustDomainPolicy{"cluster.local": {Clusters: []string{"cluster1"}, Networks: []string{"network1", "network2"}}},
	}
	_, reg, addr := startTLSServer(t, f, p, policy)
	roots := certs.Pool(p.ca)
	bookinfo := p.ca.Client(t, "spiffe://cluster.local/ns/bookinfo/sa/reviews")
	gateway := p.ca.Client(t, gatewayID)
	ok := map[string]any{"CLUSTER_ID": "cluster1", "NETWORK": "network1"}

	tests := []struct {
		name  string
		cert  *certs.Pair
		node  *corev3.Node
		claim string   // "" when served
		want  []string // in the refusal
	}{
		{name: "identity matches the node", cert: &bookinfo, node: istioNode(sidecarNS, ok)},
		{name: "allowed gateway", cert: &gateway, node: istioNode("router~10.0.0.9~eastwest-1.istio-system~istio-system.svc.cluster.local", map[string]any{"CLUSTER_ID": "cluster1", "NETWORK": "network2", "REQUESTED_NETWORK_VIEW": "network2"})},
		{name: "namespace differs from the certificate's", cert: &bookinfo, node: istioNode("sidecar~10.0.0.1~x.default~default.svc.cluster.local", ok),
			claim: claimNamespace, want: []string{`claims namespace "default"`, "spiffe://cluster.local/ns/bookinfo/sa/reviews"}},
		{name: "pod and domain name two namespaces", cert: &bookinfo, node: istioNode("sidecar~10.0.0.1~x.default~bookinfo.svc.cluster.local", ok),
			claim: claimNamespace, want: []string{`two namespaces`}},
		{name: "NAMESPACE metadata contradicts the id", cert: &bookinfo, node: istioNode(sidecarNS, map[string]any{"CLUSTER_ID": "cluster1", "NETWORK": "network1", "NAMESPACE": "default"}),
			claim: claimNamespace, want: []string{`NAMESPACE metadata says "default"`}},
		{name: "router without an allowed identity", cert: &bookinfo, node: istioNode("router~10.0.0.1~gw.bookinfo~bookinfo.svc.cluster.local", ok),
			claim: claimRouter, want: []string{"router~", "spiffe://cluster.local/ns/bookinfo/sa/reviews", "routers"}},
		{name: "cluster not allowed", cert: &bookinfo, node: istioNode(sidecarNS, map[string]any{"CLUSTER_ID": "cluster9", "NETWORK": "network1"}),
			claim: claimCluster, want: []string{`CLUSTER_ID "cluster9"`, "reviews"}},
		{name: "network not allowed", cert: &bookinfo, node: istioNode(sidecarNS, map[string]any{"CLUSTER_ID": "cluster1", "NETWORK": "network9"}),
			claim: claimNetwork, want: []string{`NETWORK "network9"`}},
		{name: "requested network not allowed", cert: &bookinfo, node: istioNode(sidecarNS, map[string]any{"CLUSTER_ID": "cluster1", "NETWORK": "network1", "REQUESTED_NETWORK_VIEW": "network1,network7"}),
			claim: claimNetwork, want: []string{`NETWORK "network7"`}},
		{name: "trust domain not allowed", cert: ptr(p.ca.Client(t, "spiffe://evil.example/ns/bookinfo/sa/reviews")), node: istioNode(sidecarNS, ok),
			claim: claimTrustDomain, want: []string{`trust domain "evil.example"`}},
		{name: "certificate without a SPIFFE ID", cert: ptr(p.ca.Client(t)), node: istioNode(sidecarNS, ok),
			claim: claimIdentity, want: []string{"no SPIFFE ID"}},
		{name: "certificate with two SPIFFE IDs", cert: ptr(p.ca.Client(t, "spiffe://cluster.local/ns/bookinfo/sa/a", "spiffe://cluster.local/ns/default/sa/b")), node: istioNode(sidecarNS, ok),
			claim: claimIdentity, want: []string{"2 SPIFFE IDs"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := metric(t, reg, "estuary_xds_denied_total", tt.claim)
			resp, err := firstAnswer(tlsStream(t, addr, roots, tt.cert), tt.node)
			if tt.claim == "" {
				if err != nil || len(resp.GetResources()) == 0 {
					t.Fatalf("not served: %v", err)
				}
				return
			}
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("got %v, %v; want PermissionDenied", resp, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(status.Convert(err).Message(), w) {
					t.Errorf("refusal %q does not say %q", status.Convert(err).Message(), w)
				}
			}
			if after := metric(t, reg, "estuary_xds_denied_total", tt.claim); after != before+1 {
				t.Errorf("estuary_xds_denied_total{claim=%q} went from %v to %v, want +1", tt.claim, before, after)
			}
		})
	}

	// Handshakes the server refuses: no certificate, a certificate from
	// another CA. Each is counted.
	for _, tt := range []struct {
		name string
		cert *certs.Pair
	}{{"no client certificate", nil}, {"certificate from another CA", ptr(p.other.Client(t, "spiffe://cluster.local/ns/bookinfo/sa/reviews"))}} {
		t.Run(tt.name, func(t *testing.T) {
			before := metric(t, reg, "estuary_xds_tls_handshake_failures_total", "*")
			st, err := openTLS(t, addr, roots, tt.cert)
			if err == nil {
				_, err = firstAnswer(st, istioNode(sidecarNS, ok))
			}
			if err == nil {
				t.Fatal("served without a trusted client certificate")
			}
			eventually(t, "the failed handshake to be counted", func() bool {
				return metric(t, reg, "estuary_xds_tls_handshake_failures_total", "*") > before
			})
		})
	}

	// A node cannot change its claims within a stream.
	t.Run("node changes within a stream", func(t *testing.T) {
		st := tlsStream(t, addr, roots, &bookinfo)
		if _, err := firstAnswer(st, istioNode(sidecarNS, ok)); err != nil {
			t.Fatal(err)
		}
		_ = st.Send(&discoveryv3.DiscoveryRequest{Node: istioNode(sidecarNS, map[string]any{"CLUSTER_ID": "cluster1", "NETWORK": "network2"}), TypeUrl: resourcev3.ListenerType})
		_, err := st.Recv()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "within a stream") {
			t.Fatalf("got %v, want PermissionDenied for a node that changed", err)
		}
	})
}

func ptr[T any](v T) *T { return &v }

// TestTLSRefusesOldVersionsAndPlainText: TLS 1.1 and plain text get no
// xDS from a TLS server.
func TestTLSRefusesOldVersionsAndPlainText(t *testing.T) {
	f := newFixture(t)
	p := newPKI(t)
	_, reg, addr := startTLSServer(t, f, p, nil)
	client := p.ca.Client(t, "spiffe://cluster.local/ns/bookinfo/sa/reviews").TLS(t)
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: certs.Pool(p.ca), Certificates: []tls.Certificate{client}, MaxVersion: tls.VersionTLS11, MinVersion: tls.VersionTLS10})
	if err == nil {
		conn.Close()
		t.Fatal("a TLS 1.1 handshake succeeded")
	}
	// The same client at TLS 1.2 is served, so the refusal was the version.
	conn, err = tls.Dial("tcp", addr, &tls.Config{RootCAs: certs.Pool(p.ca), Certificates: []tls.Certificate{client}, MaxVersion: tls.VersionTLS12, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("TLS 1.2: %v", err)
	}
	conn.Close()
	st, err := adsClient(t, addr).StreamAggregatedResources(context.Background())
	if err == nil {
		_, err = firstAnswer(st, istioNode(sidecarNS, nil))
	}
	if err == nil {
		t.Fatal("a plain-text client was served by a TLS server")
	}
	eventually(t, "failed handshakes counted", func() bool {
		return metric(t, reg, "estuary_xds_tls_handshake_failures_total", "*") >= 2
	})
}

// TestTLSFilesReload: new certificate files are served to new connections
// without ending the streams that are open; files that do not load are
// refused and the previous ones kept.
func TestTLSFilesReload(t *testing.T) {
	f := newFixture(t)
	f.populate(1, 1)
	p := newPKI(t)
	_, reg, addr := startTLSServer(t, f, p, nil)
	roots := certs.Pool(p.ca)
	client := p.ca.Client(t, "spiffe://cluster.local/ns/default/sa/client")
	st := tlsStream(t, addr, roots, &client)
	node := istioNode(envoyNode, map[string]any{"NETWORK": "network1"})
	first, err := firstAnswer(st, node)
	if err != nil {
		t.Fatal(err)
	}
	ch := pump(t, st.Recv)
	if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	servedCN := func() string {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{client.TLS(t)}, NextProtos: []string{"h2"}})
		if err != nil {
			return "error: " + err.Error()
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if cn := servedCN(); cn != "estuary-one" {
		t.Fatalf("served %q before the rotation", cn)
	}

	// Rotate: write the new pair over the old files.
	next := p.ca.Server(t, "estuary-two")
	certs.WriteFile(t, p.files.CertFile, next.CertPEM)
	certs.WriteFile(t, p.files.KeyFile, next.KeyPEM)
	eventually(t, "the new certificate to be served", func() bool { return servedCN() == "estuary-two" })

	// The stream opened before the rotation still receives pushes.
	f.service(svcHost(7), 8080)
	resp := recv(t, ch, "CDS push after the rotation")
	if resp.GetTypeUrl() != resourcev3.ClusterType || len(resp.GetResources()) != 2 {
		t.Fatalf("push after rotation: %s with %d resources", resp.GetTypeUrl(), len(resp.GetResources()))
	}

	// A key that does not match the certificate is refused; the last good
	// pair stays.
	certs.WriteFile(t, p.files.KeyFile, p.ca.Server(t, "estuary-three").KeyPEM)
	eventually(t, "the bad pair to be refused", func() bool {
		return metric(t, reg, "estuary_xds_tls_reloads_total", "error") == 1
	})
	if cn := servedCN(); cn != "estuary-two" {
		t.Fatalf("after a bad key the server presents %q, want the last good estuary-two", cn)
	}
}

// TestAuthorizeWithoutTLSIsRefused: a policy cannot be applied without
// identities, so Listen refuses it rather than serve unchecked.
func TestAuthorizeWithoutTLSIsRefused(t *testing.T) {
	f := newFixture(t)
	s := New(Options{Listen: "127.0.0.1:0", Policy: &Policy{}}, f.agg, nil, f.agg, hclog.NewNullLogger(), nil)
	if _, err := s.Listen(); err == nil {
		t.Fatal("Listen accepted a policy without TLS")
	}
}

func TestParseSPIFFEID(t *testing.T) {
	good := "spiffe://cluster.local/ns/bookinfo/sa/reviews"
	id, err := model.ParseSPIFFEID(good)
	if err != nil || id != (model.Identity{TrustDomain: "cluster.local", Namespace: "bookinfo", ServiceAccount: "reviews"}) || id.String() != good {
		t.Errorf("%s: %+v %v", good, id, err)
	}
	for _, bad := range []string{"https://cluster.local/ns/a/sa/b", "spiffe:///ns/a/sa/b", "spiffe://td/ns/a", "spiffe://td/ns//sa/b",
		"spiffe://td/sa/b/ns/a", "spiffe://td/ns/a/sa/b/c", "spiffe://u@td/ns/a/sa/b", "spiffe://td/ns/a/sa/b?x=1"} {
		if _, err := model.ParseSPIFFEID(bad); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

// metric sums the samples of a family whose first label is label (any,
// if label is "*"); a family with no labels counts whole.
func metric(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 0 || label == "*" || m.GetLabel()[0].GetValue() == label {
				v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return v
}

// eventually polls cond for up to 30s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
