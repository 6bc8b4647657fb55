package admin

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/replica"
	"github.com/estuary-mesh/estuary/host/supervisor"
	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/protoconv"
)

func newServer(failed func() []string) *Server {
	store := replica.NewStore(nil)
	return New(hclog.NewNullLogger(), Options{
		Gatherer:   prometheus.NewRegistry(),
		Aggregate:  aggregate.New(store, nil),
		Supervisor: supervisor.NewSupervisor(supervisor.Options{}, hclog.NewNullLogger(), store, nil),
		Failed:     failed,
	})
}

// TestReadyzNamesDeadComponents: a dead component makes /readyz fail with
// its name and reason, even when nothing else is pending.
func TestReadyzNamesDeadComponents(t *testing.T) {
	var dead []string
	s := newServer(func() []string { return dead })
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(); code != http.StatusOK {
		t.Fatalf("/readyz with nothing pending = %d %q, want 200", code, body)
	}
	dead = []string{"xds died: serve 127.0.0.1:15010: accept: boom"}
	if code, body := get(); code != http.StatusServiceUnavailable || body != "not ready: xds died: serve 127.0.0.1:15010: accept: boom\n" {
		t.Errorf("/readyz with a dead component = %d %q, want 503 naming it", code, body)
	}
}

// running serves s on a free port until the test ends.
func running(t *testing.T, s *Server) (url string, wait func() error, cancel context.CancelFunc) {
	t.Helper()
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	finished := make(chan struct{})
	go func() {
		runErr = s.Run(ctx)
		close(finished)
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	return "http://" + addr.String(), func() error {
		t.Helper()
		select {
		case <-finished:
			return runErr
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return within 20s")
			return nil
		}
	}, cancel
}

func healthz(url string) error {
	resp, err := http.Get(url + "/healthz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// TestRunStopsWhenItsContextEnds: Run serves until its context ends, then
// stops serving and returns nil.
func TestRunStopsWhenItsContextEnds(t *testing.T) {
	url, wait, cancel := running(t, newServer(nil))
	if err := healthz(url); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := wait(); err != nil {
		t.Errorf("Run after its context ended = %v, want nil", err)
	}
	if err := healthz(url); err == nil {
		t.Error("still serving after Run returned")
	}
}

// TestRunReturnsWhenServingFails: a listener that fails ends Run with an
// error instead of a log line.
func TestRunReturnsWhenServingFails(t *testing.T) {
	s := newServer(nil)
	url, wait, _ := running(t, s)
	if err := healthz(url); err != nil {
		t.Fatal(err)
	}
	if err := s.ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := wait(); err == nil || !strings.Contains(err.Error(), "admin: serve") {
		t.Errorf("Run after its listener failed = %v, want an admin: serve error", err)
	}
}

// TestPluginSyncSaysWhy: a plugin whose instance set is not complete is
// described with how long the host has waited, its sync timeout and what
// its unhealthy instances say; once complete, how it completed.
func TestPluginSyncSaysWhy(t *testing.T) {
	s := newServer(nil)
	store := s.agg.Store()
	if got := s.pluginSync("consul", time.Now()).Reason; got != "consul: not connected yet" {
		t.Errorf("before any stream: %q", got)
	}
	sess := store.NewSession("consul")
	defer sess.ExpireAfter(time.Minute)()
	wire := protoconv.NewStream(sdk.CapabilityMultiInstance, sdk.CapabilityInstanceSet)
	id := &registryv1.InstanceID{Provider: "Consul", Cluster: "dc1"}
	b, err := wire.Decode(&registryv1.WatchResponse{Sequence: 1, Snapshot: true, SnapshotDone: true,
		PluginHealth: &registryv1.InstanceHealth{Message: "agent: 403 Forbidden"}, Events: []*registryv1.Event{
			{Instance: id, Kind: &registryv1.Event_InstanceAdded{InstanceAdded: &registryv1.InstanceAdded{}}},
			{Instance: id, Kind: &registryv1.Event_InstanceHealth{InstanceHealth: &registryv1.InstanceHealth{Message: "connection refused"}}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	sess.ApplyBatch(b)
	set, _ := store.InstanceSet("consul")
	got := s.pluginSync("consul", set.Since.Add(2*time.Second)).Reason
	if want := "consul: instance set not complete, waiting 2s of the sync timeout 1m0s; unhealthy: plugin: agent: 403 Forbidden; Consul/dc1: connection refused"; got != want {
		t.Errorf("waiting:\n got %q\nwant %q", got, want)
	}
	sess.Expire()
	if got := s.pluginSync("consul", time.Now()).Reason; !strings.HasPrefix(got, "consul: instance set complete (by sync timeout)") {
		t.Errorf("after the timeout: %q", got)
	}
}
