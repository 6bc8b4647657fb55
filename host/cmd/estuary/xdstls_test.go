package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/estuary-mesh/estuary/host/admin"
	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/host/supervisor"
	"github.com/estuary-mesh/estuary/testbed/certs"
)

// tlsClient is a grpc-go xDS client whose bootstrap reaches estuary over
// TLS (channel_creds "tls"), trusting caFile and presenting the pair in
// certFile/keyFile (none if empty), as the node nodeID.
func tlsClient(t *testing.T, xdsAddr, caFile, certFile, keyFile, nodeID string) testgrpc.TestServiceClient {
	t.Helper()
	creds := fmt.Sprintf(`{"ca_certificate_file": %q`, caFile)
	if certFile != "" {
		creds += fmt.Sprintf(`, "certificate_file": %q, "private_key_file": %q`, certFile, keyFile)
	}
	creds += "}"
	bootstrap := fmt.Sprintf(`{
  "xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "tls", "config": %s}], "server_features": ["xds_v3"]}],
  "node": {"id": %q, "metadata": {"GENERATOR": "grpc", "NETWORK": "network1", "CLUSTER_ID": "cluster1"}}
}`, xdsAddr, creds, nodeID)
	rb, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	// The data plane to the backends is plain text: only xDS is under test.
	conn, err := grpc.NewClient("xds:///echo.default.svc.cluster.local:8080", grpc.WithResolvers(rb), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return testgrpc.NewTestServiceClient(conn)
}

// metric reads the sum of a counter's samples whose labels contain
// labels (a substring such as `claim="namespace"`, or "") from /metrics.
func (h *host) metric(name, labels string) float64 {
	h.t.Helper()
	_, body := h.get("/metrics")
	sum := 0.0
	for line := range strings.SplitSeq(string(body), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || (f[0] != name && !strings.HasPrefix(f[0], name+"{")) || !strings.Contains(f[0], labels) {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// refused checks that a client gets no answer through estuary within a
// few seconds, and that estuary counted why.
func refused(t *testing.T, h *host, c testgrpc.TestServiceClient, metric, labels string) {
	t.Helper()
	before := h.metric(metric, labels)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if name, err := call(ctx, c); err == nil {
		t.Fatalf("the call reached backend %s", name)
	}
	h.eventually(fmt.Sprintf("%s{%s} to count the refusal", metric, labels), 30*time.Second, func() bool {
		return h.metric(metric, labels) > before
	})
}

// TestXDSOverTLSWithIdentity: the real binary serves xDS over TLS with
// client certificates. A grpc-go client with a certificate of the mesh CA
// reaches the backends; without a certificate, with one from another CA,
// with a node in another namespace than its certificate, or as a router
// its identity does not allow, it gets nothing, and estuary counts why.
func TestXDSOverTLSWithIdentity(t *testing.T) {
	dir := t.TempDir()
	ca, other := certs.NewCA(t, "mesh-ca"), certs.NewCA(t, "other-ca")
	caFile := filepath.Join(dir, "ca.crt")
	certs.WriteFile(t, caFile, ca.PEM)
	srvCert, srvKey := ca.Server(t, "estuary").Write(t, dir, "xds")
	cliCert, cliKey := ca.Client(t, "spiffe://cluster.local/ns/default/sa/client").Write(t, dir, "client")
	otherCert, otherKey := other.Client(t, "spiffe://cluster.local/ns/default/sa/client").Write(t, dir, "other")

	b1, b2 := startBackend(t, "b1"), startBackend(t, "b2")
	h := startHostFile(t, func(xdsAddr, admin string) string {
		return fmt.Sprintf(`mesh {
  cluster_id = "cluster1"
}
xds {
  listen         = %q
  debounce_after = "10ms"
  tls {
    cert_file      = %q
    key_file       = %q
    client_ca_file = %q
  }
  authorize {
    routers = ["spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"]
  }
}
admin {
  listen = %q
}
%s`, xdsAddr, srvCert, srvKey, caFile, admin, echoBlock(b1, b2))
	})
	const node = "sidecar~127.0.0.1~client.default~default.svc.cluster.local"

	t.Run("served with a certificate of the mesh CA", func(t *testing.T) {
		waitServedBy(t, tlsClient(t, h.xds, caFile, cliCert, cliKey, node), "b1", "b2")
	})
	t.Run("no client certificate", func(t *testing.T) {
		refused(t, h, tlsClient(t, h.xds, caFile, "", "", node), "estuary_xds_tls_handshake_failures_total", "")
	})
	t.Run("certificate from another CA", func(t *testing.T) {
		refused(t, h, tlsClient(t, h.xds, caFile, otherCert, otherKey, node), "estuary_xds_tls_handshake_failures_total", "")
	})
	t.Run("node namespace differs from the certificate's", func(t *testing.T) {
		refused(t, h, tlsClient(t, h.xds, caFile, cliCert, cliKey, "sidecar~127.0.0.1~client.payments~payments.svc.cluster.local"),
			"estuary_xds_denied_total", `claim="namespace"`)
		h.eventually("the refusal logged with the claim and the identity", 10*time.Second, func() bool {
			log := h.log.String()
			return strings.Contains(log, `claims namespace \"payments\"`) && strings.Contains(log, "spiffe://cluster.local/ns/default/sa/client")
		})
	})
	t.Run("router without an allowed identity", func(t *testing.T) {
		refused(t, h, tlsClient(t, h.xds, caFile, cliCert, cliKey, "router~127.0.0.1~gw.default~default.svc.cluster.local"),
			"estuary_xds_denied_total", `claim="router"`)
	})
}

// TestPlainTextXDSBeyondLoopback: `estuary validate` refuses plain-text
// xDS on a non-loopback address, at the listen attribute, and accepts it
// only with insecure = true, which the host then warns about at start-up
// and in /readyz (xdsWarnings; the host is not run on a non-loopback
// address here, as tests stay on loopback).
func TestPlainTextXDSBeyondLoopback(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "plugins.hcl")
	write := func(s string) {
		certs.WriteFile(t, path, []byte(s))
	}
	write("xds {\n  listen = \"0.0.0.0:15010\"\n}\n")
	out, err := exec.Command(estuaryBin, "validate", "-config", path).CombinedOutput()
	if err == nil || !strings.Contains(string(out), path+":2:12: error: xDS beyond loopback needs tls") {
		t.Fatalf("validate: %v\n%s", err, out)
	}
	write("xds {\n  listen   = \"0.0.0.0:15010\"\n  insecure = true\n}\n")
	if out, err := exec.Command(estuaryBin, "validate", "-config", path).CombinedOutput(); err != nil {
		t.Fatalf("validate with insecure = true: %v\n%s", err, out)
	}
	f, diags := load(path)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if w := xdsWarnings(f.XDS); len(w) != 1 || !strings.Contains(w[0], "plain text on 0.0.0.0:15010") {
		t.Errorf("warnings %q", w)
	}
	// /readyz shows the warning, ready or not.
	store := replica.NewStore(nil)
	adm := admin.New(hclog.NewNullLogger(), admin.Options{
		Gatherer: prometheus.NewRegistry(), Aggregate: aggregate.New(store, nil),
		Supervisor: supervisor.NewSupervisor(supervisor.Options{}, hclog.NewNullLogger(), store, nil),
		Warnings:   func() []string { return xdsWarnings(f.XDS) },
	})
	rec := httptest.NewRecorder()
	adm.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, "ready\nwarning: xDS serves plain text on 0.0.0.0:15010") {
		t.Errorf("/readyz = %d %q, want ready with the warning", rec.Code, body)
	}
	f.XDS.Listen = "127.0.0.1:15010"
	if w := xdsWarnings(f.XDS); len(w) != 0 {
		t.Errorf("loopback warned: %q", w)
	}
}
