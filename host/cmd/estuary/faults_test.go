package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/estuary-mesh/estuary/testbed/xdsload"
)

// The fault suite on the real binary (issue 11.7): each test breaks one
// thing a real deployment breaks, and checks the promise the README makes
// about it. The README's "Faults" table lists them with the rest of the
// suite in other packages.

// testPluginBlock is a plugin block that runs this test binary as the
// external plugin mode (see faultplugins_test.go).
func testPluginBlock(t *testing.T, label, mode, attrs, config string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("plugin %q {\n  path   = %q\n  sha256 = %q\n  env    = { ESTUARY_TEST_PLUGIN = %q }\n%s  config {\n%s  }\n}\n",
		label, self, sha256File(t, self), mode, attrs, config)
}

// gateBlock runs the gate plugin serving hostnames; gate and entered are
// paths (see gateFactory), "" for none.
func gateBlock(t *testing.T, label, attrs, gate, entered string, hostnames ...string) string {
	t.Helper()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "    hostnames = [%s]\n", quoteAll(hostnames))
	if gate != "" {
		fmt.Fprintf(&cfg, "    gate = %q\n", gate)
	}
	if entered != "" {
		fmt.Fprintf(&cfg, "    entered = %q\n", entered)
	}
	return testPluginBlock(t, label, "gate", attrs, cfg.String())
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// services returns the hostnames plugin serves and whether its instances
// are stale.
func (h *host) services(plugin string) (hostnames []string, stale bool) {
	h.t.Helper()
	var r registryz
	h.getJSON("/debug/registryz", &r)
	hs := r.hostnames(plugin)
	slices.Sort(hs)
	return hs, r.stale(plugin)
}

// pluginStatus is one plugin in /debug/pluginz, with its last error.
func (h *host) pluginStatus(label string) (state, lastError string, pid, restarts int) {
	h.t.Helper()
	var ps []struct {
		Label     string `json:"label"`
		State     string `json:"state"`
		PID       int    `json:"pid"`
		Restarts  int    `json:"restarts"`
		LastError string `json:"last_error"`
	}
	h.getJSON("/debug/pluginz", &ps)
	for _, p := range ps {
		if p.Label == label {
			return p.State, p.LastError, p.PID, p.Restarts
		}
	}
	h.t.Fatalf("no plugin %q in /debug/pluginz", label)
	return
}

// reloadWith rewrites the plugin blocks and sends SIGHUP.
func (h *host) reloadWith(plugins string) {
	h.rewrite(plugins)
	h.signal(syscall.SIGHUP)
}

// logCount counts the lines of the host's log that contain s.
func (h *host) logCount(s string) int { return strings.Count(h.log.String(), s) }

// TestPluginSendsGarbage: a plugin sends a batch whose first event is
// valid and whose second has no kind. The stream ends with an error that
// names the batch, the event and the instance; nothing of the batch is
// applied (half.test never appears); the plugin's last good state keeps
// serving, stale; the plugin backs off into crash-looping as it repeats
// itself; another plugin and reloads are unaffected.
// Fails if: the batch is applied in part, the error is vague, the good
// state is dropped, or the host or the other plugin suffers.
func TestPluginSendsGarbage(t *testing.T) {
	h := startHost(t, staticBlock("good", "good.example.com")+testPluginBlock(t, "garbage", "garbage", "", ""))
	const want = `protocol error in batch 2, event 1 (event without a kind, instance "Raw/raw-cluster"): the event has no kind this protocol version knows`
	h.eventually("the plugin crash-looping on its garbage", 60*time.Second, func() bool {
		hs, _ := h.services("garbage")
		if slices.Contains(hs, "half.test") {
			t.Fatalf("the first event of the refused batch was applied: %v", hs)
		}
		state, lastErr, _, restarts := h.pluginStatus("garbage")
		return state == "crash-looping" && restarts >= 2 && strings.Contains(lastErr, want)
	})
	if !strings.Contains(h.log.String(), "plugin broke the protocol") {
		t.Error("the host did not log the protocol error")
	}
	if hs, stale := h.services("garbage"); !slices.Equal(hs, []string{"raw.test"}) || !stale {
		t.Errorf("garbage plugin's state: %v stale=%v; want its good snapshot, raw.test, served stale", hs, stale)
	}
	if state, _, _, restarts := h.pluginStatus("good"); state != "running" || restarts != 0 {
		t.Errorf("the other plugin is %s after %d restarts", state, restarts)
	}
	if code, body := h.get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz %d %s while one plugin sends garbage", code, body)
	}
	h.reloadWith(staticBlock("good", "good.example.com", "more.example.com") + testPluginBlock(t, "garbage", "garbage", "", ""))
	h.eventually("the other plugin's reload", 30*time.Second, func() bool {
		hs, _ := h.services("good")
		return slices.Equal(hs, []string{"good.example.com", "more.example.com"})
	})
}

// TestPluginFloodsEvents: a plugin sends endpoint batches as fast as the
// host reads them, for ever. Meanwhile another plugin's change reaches a
// sidecar's EDS and the host stays ready.
// Fails if: the flood starves the other plugin's stream, the replica or
// the xDS pushes (the change never arrives), or readiness drops.
func TestPluginFloodsEvents(t *testing.T) {
	good := func(addr string) string {
		return fmt.Sprintf(`plugin "good" {
  bundled = "static"
  config {
    cluster = "good-cluster"
    service "good.example.com" {
      port "http" {
        number = 80
      }
      endpoint {
        address = %q
      }
    }
  }
}
`, addr)
	}
	flood := testPluginBlock(t, "flood", "flood", "", "")
	h := startHost(t, good("10.0.0.1")+flood)
	eds := watchEDS(t, h.xds, "outbound|80||good.example.com")
	h.eventually("the sidecar's first EDS", 30*time.Second, func() bool {
		got, _ := eds.since(0)
		return len(got) > 0 && slices.Equal(got[len(got)-1], []string{"10.0.0.1"})
	})
	// The flood is on: events keep arriving.
	floodEvents := func() float64 {
		return metricSum(h, `estuary_registry_events_total{kind="endpoints_replaced",plugin="flood"}`)
	}
	first := floodEvents()
	h.eventually("the flood to go on", 30*time.Second, func() bool { return floodEvents() > first+1000 })

	h.reloadWith(good("10.0.0.2") + flood)
	h.eventually("the other plugin's change in the sidecar's EDS", 60*time.Second, func() bool {
		if code, body := h.get("/readyz"); code != http.StatusOK {
			t.Fatalf("/readyz %d %s during the flood", code, body)
		}
		got, _ := eds.since(0)
		return slices.Equal(got[len(got)-1], []string{"10.0.0.2"})
	})
	if now := floodEvents(); now <= first+1000 {
		t.Errorf("the flood stopped: %v events", now)
	}
	if state, _, _, restarts := h.pluginStatus("good"); state != "running" || restarts != 0 {
		t.Errorf("the other plugin is %s after %d restarts", state, restarts)
	}
}

// metricSum reads the value of one series from /metrics (0 if absent).
func metricSum(h *host, series string) float64 {
	h.t.Helper()
	_, body := h.get("/metrics")
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindSubmatch(body)
	if m == nil {
		return 0
	}
	var v float64
	fmt.Sscan(string(m[1]), &v)
	return v
}

// TestPluginHangsInConfigure: a plugin never returns from Configure. The
// host is not ready while it waits for it, and says whom it waits for;
// once the plugin's sync_timeout passes it is ready and serves the other
// plugin to xDS clients; removing the hung plugin by a reload kills it.
// Fails if: the hang blocks readiness for ever, holds xDS, or blocks a
// reload, or the hung process outlives its removal.
func TestPluginHangsInConfigure(t *testing.T) {
	never := filepath.Join(t.TempDir(), "never")
	entered := filepath.Join(t.TempDir(), "entered")
	good := staticBlock("good", "good.example.com")
	stuck := gateBlock(t, "stuck", "  sync_timeout = \"8s\"\n", never, entered, "stuck.test")
	h := launchHost(t, func(xds, admin string) string { return hostConfig(xds, admin, good+stuck) })
	h.eventually("the plugin in Configure", 30*time.Second, func() bool {
		_, err := os.Stat(entered)
		return err == nil
	})
	if code, body := h.get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(string(body), "stuck") {
		t.Fatalf("/readyz %d %s while the plugin hangs in Configure, before its sync timeout; want 503 naming it", code, body)
	}
	h.eventually("ready after the sync timeout", 30*time.Second, func() bool {
		code, _ := h.get("/readyz")
		return code == http.StatusOK
	})
	eds := watchEDS(t, h.xds, "outbound|80||good.example.com")
	h.eventually("the other plugin served to a sidecar", 30*time.Second, func() bool {
		got, _ := eds.since(0)
		return len(got) > 0 && slices.Equal(got[len(got)-1], []string{"10.0.0.1"})
	})
	state, _, pid, _ := h.pluginStatus("stuck")
	if state != "starting" || !processAlive(pid) {
		t.Fatalf("hung plugin: state %s pid %d", state, pid)
	}

	h.reloadWith(good)
	h.eventually("the hung plugin gone", 30*time.Second, func() bool {
		var ps pluginz
		h.getJSON("/debug/pluginz", &ps)
		return len(ps) == 1 && !processAlive(pid)
	})
}

// TestSIGHUPDuringStartUp: the config changes while a plugin is still in
// its start-up Configure. Once that returns, the plugin serves the new
// block, not the one it started with.
// Fails if: the SIGHUP is lost (a.test stays), or it restarts the plugin
// in a loop.
func TestSIGHUPDuringStartUp(t *testing.T) {
	dir := t.TempDir()
	gate, entered := filepath.Join(dir, "gate"), filepath.Join(dir, "entered")
	attrs := "  sync_timeout = \"10m\"\n"
	h := launchHost(t, func(xds, admin string) string {
		return hostConfig(xds, admin, gateBlock(t, "slow", attrs, gate, entered, "a.test"))
	})
	h.eventually("the plugin in its start-up Configure", 30*time.Second, func() bool {
		_, err := os.Stat(entered)
		return err == nil
	})
	h.reloadWith(gateBlock(t, "slow", attrs, "", "", "b.test"))
	h.eventually("the reload taken", 30*time.Second, func() bool { return h.logCount("reload applied") == 1 })
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h.eventually("the new block served", 30*time.Second, func() bool {
		hs, stale := h.services("slow")
		return slices.Equal(hs, []string{"b.test"}) && !stale
	})
	if state, _, _, restarts := h.pluginStatus("slow"); state != "running" || restarts != 0 {
		t.Errorf("plugin %s after %d restarts; want running, never restarted", state, restarts)
	}
	var cz struct {
		Plugins []struct {
			Config  map[string]any `json:"config"`
			Running bool           `json:"running"`
		} `json:"plugins"`
	}
	h.getJSON("/debug/configz", &cz)
	if len(cz.Plugins) != 1 || !cz.Plugins[0].Running || fmt.Sprint(cz.Plugins[0].Config["hostnames"]) != "[b.test]" {
		t.Errorf("configz: %+v, want the new block running", cz)
	}
}

// TestRejectedReconfigureThenCrash: a reload gives a running plugin a
// block it refuses; then the plugin is killed. It restarts with the block
// it last accepted, which configz shows as running, and the refused one
// apart.
// Fails if: the refused block replaced the stored one (the restart then
// fails on it, or serves nothing), or configz shows the refused block as
// running.
func TestRejectedReconfigureThenCrash(t *testing.T) {
	h := startHost(t, gateBlock(t, "g", "", "", "", "a.test"))
	h.reloadWith(gateBlock(t, "g", "", "", "", "bad."))
	h.eventually("the plugin to refuse the block", 30*time.Second, func() bool {
		return strings.Contains(h.log.String(), `"bad." is not a host name`)
	})
	_, _, pid, _ := h.pluginStatus("g")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.eventually("the plugin restarted", 30*time.Second, func() bool {
		state, _, now, _ := h.pluginStatus("g")
		return state == "running" && now != pid
	})
	h.eventually("the accepted block served fresh", 30*time.Second, func() bool {
		hs, stale := h.services("g")
		if !slices.Equal(hs, []string{"a.test"}) {
			t.Fatalf("after the restart the plugin serves %v, want a.test", hs)
		}
		return !stale
	})
	var cz struct {
		Plugins []struct {
			Config  map[string]any `json:"config"`
			Running bool           `json:"running"`
			File    *struct {
				Config map[string]any `json:"config"`
			} `json:"file"`
		} `json:"plugins"`
	}
	h.getJSON("/debug/configz", &cz)
	if len(cz.Plugins) != 1 {
		t.Fatalf("configz: %+v", cz)
	}
	p := cz.Plugins[0]
	// (The host decodes an external plugin's block only with the schema
	// of the process it configures, so the file's block shows no fields.)
	if !p.Running || fmt.Sprint(p.Config["hostnames"]) != "[a.test]" || p.File == nil {
		t.Errorf("configz: running=%v config=%v file=%+v; want a.test running, the file's block shown apart", p.Running, p.Config, p.File)
	}
}

// TestConfigFileReplacedAtomically: the file is replaced, not rewritten:
// by rename(2) over it, as editors and config management do, and by the
// symlink swap of a Kubernetes ConfigMap volume. Each SIGHUP reads the new
// file.
// Fails if: the host keeps reading the file it opened first (an old inode
// or a resolved symlink target).
func TestConfigFileReplacedAtomically(t *testing.T) {
	t.Run("rename", func(t *testing.T) {
		h := startHost(t, staticBlock("static", "a.example.com"))
		for i, host := range []string{"b.example.com", "c.example.com"} {
			tmp := filepath.Join(filepath.Dir(h.config), fmt.Sprintf(".plugins.hcl.%d", i))
			content := hostConfig(h.xds, strings.TrimPrefix(h.admin, "http://"), staticBlock("static", host))
			if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, h.config); err != nil {
				t.Fatal(err)
			}
			h.signal(syscall.SIGHUP)
			h.eventually(host, 30*time.Second, func() bool {
				hs, _ := h.services("static")
				return slices.Equal(hs, []string{host})
			})
		}
	})
	t.Run("configmap", func(t *testing.T) {
		// plugins.hcl -> ..data/plugins.hcl, ..data -> ..v1, as the kubelet
		// lays a ConfigMap volume out; an update writes ..v2 and swaps ..data.
		dir := t.TempDir()
		var version int
		update := func(content string) {
			version++
			v := fmt.Sprintf("..v%d", version)
			if err := os.Mkdir(filepath.Join(dir, v), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, v, "plugins.hcl"), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			tmp := filepath.Join(dir, "..data_tmp")
			if err := os.Symlink(v, tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
		}
		var xdsAddr, adminAddr string
		h := launchHostAt(t, func(xds, admin string) string {
			xdsAddr, adminAddr = xds, admin
			update(hostConfig(xds, admin, staticBlock("static", "a.example.com")))
			link := filepath.Join(dir, "plugins.hcl")
			if err := os.Symlink(filepath.Join("..data", "plugins.hcl"), link); err != nil {
				t.Fatal(err)
			}
			return link
		})
		h.eventually("a.example.com", 30*time.Second, func() bool {
			code, _ := h.get("/readyz")
			if code != http.StatusOK {
				return false
			}
			hs, _ := h.services("static")
			return slices.Equal(hs, []string{"a.example.com"})
		})
		for _, host := range []string{"b.example.com", "c.example.com"} {
			update(hostConfig(xdsAddr, adminAddr, staticBlock("static", host)))
			h.signal(syscall.SIGHUP)
			h.eventually(host, 30*time.Second, func() bool {
				hs, _ := h.services("static")
				return slices.Equal(hs, []string{host})
			})
		}
	})
}

// TestConfigFileTruncatedMidWrite: SIGHUP arrives while the file is being
// written: cut in the middle of a block, or empty (truncated, nothing
// written yet). The reload is refused with the file's position or the
// reason, and every plugin keeps running its config, not restarted; the
// whole file, once written, applies.
// Fails if: a partial file is applied (a plugin stopped or its services
// gone), or the refusal does not say where or why.
func TestConfigFileTruncatedMidWrite(t *testing.T) {
	both := staticBlock("one", "a.example.com") + staticBlock("two", "b.example.com")
	h := startHost(t, both)
	_, _, pid1, _ := h.pluginStatus("one")
	_, _, pid2, _ := h.pluginStatus("two")
	full := hostConfig(h.xds, strings.TrimPrefix(h.admin, "http://"), both+staticBlock("three", "c.example.com"))
	cut := strings.Index(full, `plugin "two"`) + 40
	tests := []struct {
		name    string
		content string
		want    string // in the rejection
	}{
		{"mid-block", full[:cut], "plugins.hcl:"},
		{"empty", "", "is empty"},
	}
	for i, tt := range tests {
		h.write(tt.content)
		h.signal(syscall.SIGHUP)
		h.eventually(tt.name+" rejected", 30*time.Second, func() bool { return h.logCount("reload rejected") == i+1 })
		if !strings.Contains(h.log.String(), tt.want) {
			t.Errorf("%s: the rejection does not say %q:\n%s", tt.name, tt.want, h.log.String())
		}
		for label, host := range map[string]string{"one": "a.example.com", "two": "b.example.com"} {
			if hs, stale := h.services(label); !slices.Equal(hs, []string{host}) || stale {
				t.Errorf("%s: plugin %s serves %v (stale %v) after a refused reload", tt.name, label, hs, stale)
			}
		}
	}
	if _, _, p, _ := h.pluginStatus("one"); p != pid1 {
		t.Errorf("plugin one restarted: pid %d -> %d", pid1, p)
	}
	if _, _, p, _ := h.pluginStatus("two"); p != pid2 {
		t.Errorf("plugin two restarted: pid %d -> %d", pid2, p)
	}
	h.write(full)
	h.signal(syscall.SIGHUP)
	h.eventually("the whole file applied", 30*time.Second, func() bool {
		hs, _ := h.services("three")
		return slices.Equal(hs, []string{"c.example.com"})
	})
}

// TestReconnectStormAfterHostRestart: 1,000 proxies (SotW and Delta, one
// connection each) are served; the host is killed and started again, and
// one of its plugins is slow to configure this time. Every proxy
// reconnects at once to the new host, is held until it is ready, and is
// then served the whole config.
// Fails if: any proxy gets an empty or partial CDS (the restarted host
// answered before the slow plugin synced), an empty CLA, or NACKs, or
// some proxy is never served again.
func TestReconnectStormAfterHostRestart(t *testing.T) {
	const clients = 1000
	gate := filepath.Join(t.TempDir(), "gate")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	plugins := staticBlock("static", "a.example.com", "b.example.com") +
		gateBlock(t, "slow", "  sync_timeout = \"10m\"\n", gate, "", "s.test")
	h := startHost(t, plugins)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fleet, err := xdsload.Start(ctx, xdsload.Options{
		Addr: h.xds, Clients: clients, Protocol: xdsload.Mixed, Kind: xdsload.Sidecar,
		ClusterID: "cluster1",
		Required:  []string{"outbound|80||a.example.com", "outbound|80||b.example.com", "outbound|80||s.test"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	if err := fleet.WaitServed(ctx); err != nil {
		t.Fatalf("before the restart: %v (%+v)", err, fleet.Stats())
	}
	streams := fleet.Stats().Streams

	// Down, and back with the slow plugin held in Configure.
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	h.signal(syscall.SIGKILL)
	h2 := h.again()
	waitFleet(t, ctx, fleet, "every client on a new stream", func(s xdsload.Stats) bool {
		return s.Streams >= streams+clients && s.Connected == clients
	})
	if code, body := h2.get("/readyz"); code == http.StatusOK {
		t.Fatalf("the restarted host is ready while a plugin is in Configure: %s", body)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := fleet.WaitServed(ctx); err != nil {
		t.Fatalf("after the restart: %v (%+v)", err, fleet.Stats())
	}
	st := fleet.Stats()
	if st.Problems != 0 || st.NACKs != 0 {
		t.Errorf("%d problems, %d NACKs: %v", st.Problems, st.NACKs, fleet.Problems())
	}
}

// waitFleet polls the fleet's stats until ok holds.
func waitFleet(t *testing.T, ctx context.Context, f *xdsload.Fleet, what string, ok func(xdsload.Stats) bool) {
	t.Helper()
	for !ok(f.Stats()) {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v; stats %+v", what, ctx.Err(), f.Stats())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
