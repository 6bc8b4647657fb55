package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/estuary-mesh/estuary/xds"
)

// TestXDSHoldsClientsUntilReady: a client that connects while a plugin
// has not synced (its sync_timeout is an hour away) is held: its stream
// stays open and unanswered. Once the host is ready (here: the plugin is
// removed by a reload) it is answered, and not before /readyz says so.
func TestXDSHoldsClientsUntilReady(t *testing.T) {
	// A plugin that fails at once, again and again, so never syncs.
	silent := filepath.Join(t.TempDir(), "silent-plugin")
	script := []byte("#!/bin/sh\nexit 1\n")
	if err := os.WriteFile(silent, script, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(script)
	missing := fmt.Sprintf("plugin \"missing\" {\n  path = %q\n  sha256 = %q\n  sync_timeout = \"1h\"\n}\n", silent, hex.EncodeToString(sum[:]))
	static := staticBlock("static", "a.example.com")
	srv, _ := inProcess(t, static+missing)
	signals := make(chan os.Signal, 1)
	finished := make(chan error, 1)
	started := make(chan struct{})
	go func() { finished <- srv.run(context.Background(), signals, func() { close(started) }) }()
	<-started
	t.Cleanup(func() {
		signals <- syscall.SIGTERM
		<-finished
	})

	conn, err := grpc.NewClient(srv.xdsAddr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		resp  *discoveryv3.DiscoveryResponse
		err   error
		ready bool // what /readyz said when the response arrived
	}
	answers := make(chan answer, 1)
	go func() {
		resp, err := st.Recv()
		ready, _ := srv.admin.Ready(time.Now())
		answers <- answer{resp, err, ready}
	}()
	node := &corev3.Node{Id: "sidecar~10.1.1.1~c.default~default.svc.cluster.local"}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	// The request has reached the server, the static plugin's cluster is
	// there to send, and the host is not ready.
	waitFor(t, "the CDS request to reach the server", func() bool {
		for _, c := range srv.xds.Clients() {
			if _, ok := c.Types["cds"]; ok {
				return true
			}
		}
		return false
	})
	parsed := xds.ParseNode(node)
	waitFor(t, "the static plugin's cluster", func() bool {
		return len(srv.xds.Cache().Resources(parsed.View(), resourcev3.ClusterType)) > 0
	})
	if ready, waiting := srv.admin.Ready(time.Now()); ready || !slices.ContainsFunc(waiting, func(w string) bool { return strings.HasPrefix(w, "plugin missing") }) {
		t.Fatalf("ready = %v waiting for %v, want not ready, waiting for the missing plugin", ready, waiting)
	}

	if err := os.WriteFile(srv.path, []byte(hostConfig("127.0.0.1:0", "127.0.0.1:0", static)), 0o644); err != nil {
		t.Fatal(err)
	}
	signals <- syscall.SIGHUP
	select {
	case a := <-answers:
		if a.err != nil {
			t.Fatalf("the held stream ended: %v", a.err)
		}
		if !a.ready {
			t.Errorf("a response arrived while /readyz was false")
		}
		if len(a.resp.GetResources()) == 0 {
			t.Errorf("the first CDS is empty")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the held client was not answered within 30s of the host being ready")
	}
}

// waitFor polls ok until it holds, failing after 30s.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 30s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
