package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/sdk/redact"
)

// inProcess builds `estuary run` in the test's process over plugins (plugin
// blocks), listening on free ports, without running it.
func inProcess(t *testing.T, plugins string) (*server, *syncBuffer) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "plugins.hcl")
	if err := os.WriteFile(path, []byte(hostConfig("127.0.0.1:0", "127.0.0.1:0", plugins)), 0o644); err != nil {
		t.Fatal(err)
	}
	file, diags := load(path)
	if diags.HasErrors() {
		t.Fatal(config.Format(diags))
	}
	log := &syncBuffer{}
	srv, err := newServer(path, file, estuaryBin, hclog.New(&hclog.LoggerOptions{Name: "estuary", Level: hclog.Debug, Output: log}), &redact.Secrets{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("estuary log:\n%s", log.String())
		}
	})
	return srv, log
}

// TestAComponentThatDiesStopsTheHost: when a component's Run ends while
// the host runs, /readyz reports it by name, it is logged as an error, the
// other components stop (plugins included) and run returns the error, so
// estuary exits non-zero for its supervisor to restart it.
func TestAComponentThatDiesStopsTheHost(t *testing.T) {
	srv, log := inProcess(t, staticBlock("static", "a.example.com"))
	die := make(chan struct{})
	srv.components = append(srv.components, component{"doomed", func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return nil
		case <-die:
			return errors.New("injected failure")
		}
	}})
	started := make(chan struct{})
	finished := make(chan error, 1)
	go func() { finished <- srv.run(context.Background(), nil, func() { close(started) }) }()
	<-started
	admin := "http://" + srv.adminAddr.String()
	readyz := func() (int, string) {
		resp, err := http.Get(admin + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(30 * time.Second)
	for code, _ := readyz(); code != http.StatusOK; code, _ = readyz() {
		if time.Now().After(deadline) {
			t.Fatal("the host was not ready within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	var pid int
	for _, st := range srv.sup.Statuses() {
		pid = st.PID
	}
	if pid == 0 {
		t.Fatal("the static plugin has no process")
	}

	close(die)
	var err error
	select {
	case err = <-finished:
	case <-time.After(30 * time.Second):
		t.Fatal("the host still ran 30s after a component died")
	}
	if err == nil || !strings.Contains(err.Error(), "doomed: injected failure") {
		t.Errorf("run = %v, want the doomed component's error", err)
	}
	// The admin server has stopped with the rest; its handler still says
	// what /readyz said from the moment the component died.
	rec := httptest.NewRecorder()
	srv.admin.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "doomed died: injected failure") {
		t.Errorf("/readyz after the death = %d %q, want 503 naming the doomed component", rec.Code, rec.Body.String())
	}
	if want := `[ERROR] estuary: component died; stopping the host: component=doomed error="injected failure"`; !strings.Contains(log.String(), want) {
		t.Errorf("the log lacks %q", want)
	}
	if code, _ := readyz(); code != 0 {
		t.Errorf("the admin server still answers (%d) after the host stopped", code)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("plugin pid %d still runs after the host stopped", pid)
	}
}

// TestStopSignalIsNoFailure: SIGTERM stops every component and run
// returns nil, so estuary exits 0; no component is reported dead.
func TestStopSignalIsNoFailure(t *testing.T) {
	srv, log := inProcess(t, "")
	signals := make(chan os.Signal, 1)
	finished := make(chan error, 1)
	go func() { finished <- srv.run(context.Background(), signals, func() {}) }()
	signals <- syscall.SIGTERM
	select {
	case err := <-finished:
		if err != nil {
			t.Errorf("run after SIGTERM = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the host still ran 30s after SIGTERM")
	}
	if f := srv.failures.list(); len(f) != 0 {
		t.Errorf("components reported dead after SIGTERM: %v", f)
	}
	if strings.Contains(log.String(), "[ERROR]") {
		t.Errorf("a clean stop logged an error:\n%s", log.String())
	}
}
