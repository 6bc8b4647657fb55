package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/testbed"
)

// estuaryBin is the binary under test, built once by TestMain.
var estuaryBin string

func TestMain(m *testing.M) {
	switch os.Getenv("ESTUARY_TEST_PLUGIN") {
	case "bulk":
		sdk.Serve(bulkFactory)
		return
	case "gate":
		sdk.Serve(gateFactory)
		return
	case "garbage", "flood":
		serveRaw(os.Getenv("ESTUARY_TEST_PLUGIN"))
		return
	}
	dir, err := os.MkdirTemp("", "estuary-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	estuaryBin = filepath.Join(dir, "estuary")
	build := exec.Command("go", "build", "-o", estuaryBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building estuary:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// hostLogLevel is the -log-level of hosts the tests start. The fleet
// benchmark lowers it: a debug line per stream of 10,000 clients would be
// what it measures.
var hostLogLevel = "debug"

// host is a running estuary process.
type host struct {
	t      testing.TB
	cmd    *exec.Cmd
	config string // path of plugins.hcl
	admin  string // http://ADDR
	xds    string // ADDR
	log    *syncBuffer
	exited chan struct{}
	// adminToken, if set, is sent to the admin server (admin { token_file }).
	adminToken string
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// hostConfig prefixes plugin blocks with xds and admin blocks on free ports.
func hostConfig(xds, admin, plugins string) string {
	return fmt.Sprintf("mesh {\n  cluster_id = \"cluster1\"\n}\nxds {\n  listen = %q\n  debounce_after = \"10ms\"\n}\nadmin {\n  listen = %q\n}\n%s", xds, admin, plugins)
}

// startHost writes plugins (plugin blocks) into a config file and runs
// estuary on it until it is ready.
func startHost(t testing.TB, plugins string) *host {
	t.Helper()
	return startHostFile(t, func(xds, admin string) string { return hostConfig(xds, admin, plugins) })
}

// startHostFile runs estuary, until it is ready, on the whole config file
// that content writes for the xDS and admin addresses it is given.
func startHostFile(t testing.TB, content func(xds, admin string) string) *host {
	t.Helper()
	h := launchHost(t, content)
	h.eventually("ready", 30*time.Second, func() bool {
		code, _ := h.get("/readyz")
		return code == http.StatusOK
	})
	return h
}

// launchHost runs estuary on the config file content writes, without
// waiting for anything.
func launchHost(t testing.TB, content func(xds, admin string) string) *host {
	t.Helper()
	path := filepath.Join(t.TempDir(), "plugins.hcl")
	return launchHostAt(t, func(xds, admin string) string {
		if err := os.WriteFile(path, []byte(content(xds, admin)), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	})
}

// launchHostAt runs estuary on the config file that install writes for
// the xDS and admin addresses it is given; install returns its path.
func launchHostAt(t testing.TB, install func(xds, admin string) (path string)) *host {
	t.Helper()
	h := &host{t: t, xds: freeAddr(t), log: &syncBuffer{}, exited: make(chan struct{})}
	adminAddr := freeAddr(t)
	h.admin = "http://" + adminAddr
	h.config = install(h.xds, adminAddr)
	h.start()
	return h
}

// again runs another estuary on h's config file and addresses, once h has
// exited, as a restarted host; it does not wait for anything.
func (h *host) again() *host {
	h.t.Helper()
	<-h.exited
	next := &host{t: h.t, config: h.config, admin: h.admin, xds: h.xds, log: &syncBuffer{}, exited: make(chan struct{})}
	next.start()
	return next
}

func (h *host) start() {
	t := h.t
	h.cmd = exec.Command(estuaryBin, "run", "-config", h.config, "-log-level", hostLogLevel)
	h.cmd.Stdout, h.cmd.Stderr = h.log, h.log
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = h.cmd.Wait()
		close(h.exited)
	}()
	t.Cleanup(func() {
		_ = h.cmd.Process.Kill()
		<-h.exited
		if t.Failed() {
			t.Logf("estuary log:\n%s", h.log.String())
		}
	})
}

// rewrite replaces the plugin blocks, keeping the listen addresses.
func (h *host) rewrite(plugins string) {
	h.write(hostConfig(h.xds, strings.TrimPrefix(h.admin, "http://"), plugins))
}

func (h *host) write(content string) {
	if err := os.WriteFile(h.config, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) signal(sig syscall.Signal) {
	if err := h.cmd.Process.Signal(sig); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) get(path string) (int, []byte) {
	req, err := http.NewRequest(http.MethodGet, h.admin+path, nil)
	if err != nil {
		return 0, nil
	}
	if h.adminToken != "" {
		req.Header.Set("Authorization", "Bearer "+h.adminToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (h *host) getJSON(path string, v any) {
	h.t.Helper()
	code, b := h.get(path)
	if code != http.StatusOK {
		h.t.Fatalf("GET %s: %d %s", path, code, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		h.t.Fatalf("GET %s: %v", path, err)
	}
}

func (h *host) eventually(what string, timeout time.Duration, ok func() bool) {
	h.t.Helper()
	testbed.Eventually(h.t, h.exited, what, timeout, 5*time.Millisecond, ok)
}

// registryz is the part of /debug/registryz the tests read.
type registryz struct {
	Instances []struct {
		Key struct {
			Plugin, Provider, Cluster string
		} `json:"key"`
		Stale    bool `json:"stale"`
		Synced   bool `json:"synced"`
		Services []struct {
			Hostname  string
			Endpoints int `json:"endpoints"`
		} `json:"services"`
	} `json:"instances"`
}

func (r registryz) hostnames(plugin string) []string {
	var out []string
	for _, in := range r.Instances {
		if in.Key.Plugin != plugin {
			continue
		}
		for _, s := range in.Services {
			out = append(out, s.Hostname)
		}
	}
	return out
}

func (r registryz) stale(plugin string) bool {
	for _, in := range r.Instances {
		if in.Key.Plugin == plugin && in.Stale {
			return true
		}
	}
	return false
}

// pluginz is the part of /debug/pluginz the tests read.
type pluginz []struct {
	Label    string `json:"label"`
	State    string `json:"state"`
	PID      int    `json:"pid"`
	Restarts int    `json:"restarts"`
	Version  string `json:"version"`
}

func (h *host) plugin(label string) (state string, pid, restarts int) {
	var ps pluginz
	h.getJSON("/debug/pluginz", &ps)
	for _, p := range ps {
		if p.Label == label {
			return p.State, p.PID, p.Restarts
		}
	}
	h.t.Fatalf("no plugin %q in /debug/pluginz", label)
	return "", 0, 0
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	if err != nil {
		return false
	}
	// A zombie child of a dead host still answers signal 0; check its state.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b))
	return len(fields) > 2 && fields[2] != "Z"
}
