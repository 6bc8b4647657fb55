package main

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// staticBlock is a static plugin block serving one service per hostname,
// each with one endpoint.
func staticBlock(label string, hostnames ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "plugin %q {\n  bundled = \"static\"\n  config {\n    cluster = %q\n", label, label+"-cluster")
	for i, h := range hostnames {
		fmt.Fprintf(&b, "    service %q {\n      port \"http\" {\n        number = 80\n      }\n      endpoint {\n        address = \"10.0.0.%d\"\n      }\n    }\n", h, i+1)
	}
	b.WriteString("  }\n}\n")
	return b.String()
}

func TestKillPluginKeepsLastKnownStateThenResyncs(t *testing.T) {
	h := startHost(t, staticBlock("static", "a.example.com", "b.example.com"))
	var r registryz
	h.getJSON("/debug/registryz", &r)
	if got := r.hostnames("static"); !slices.Equal(got, []string{"a.example.com", "b.example.com"}) {
		t.Fatalf("services = %v", got)
	}
	_, pid, _ := h.plugin("static")

	// While the plugin is down, the operator removes b from the file.
	h.rewrite(staticBlock("static", "a.example.com"))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.signal(syscall.SIGHUP)

	// Throughout: never empty, a always served; stale at some point; then
	// fresh without b.
	sawStale := false
	h.eventually("resync without b", 30*time.Second, func() bool {
		var r registryz
		h.getJSON("/debug/registryz", &r)
		got := r.hostnames("static")
		if !slices.Contains(got, "a.example.com") {
			t.Fatalf("a.example.com vanished while the plugin restarted: %v", got)
		}
		if r.stale("static") {
			sawStale = true
			if !slices.Contains(got, "b.example.com") {
				t.Fatalf("stale state lost b.example.com before the new snapshot synced: %v", got)
			}
		}
		return !r.stale("static") && slices.Equal(got, []string{"a.example.com"})
	})
	if !sawStale {
		t.Errorf("never saw the instance marked stale while its plugin was down")
	}
	state, newPID, restarts := h.plugin("static")
	if state != "running" || newPID == pid || restarts < 1 {
		t.Errorf("after kill: state %s pid %d (was %d) restarts %d", state, newPID, pid, restarts)
	}
}

func TestSIGHUPWithInvalidFileKeepsRunningConfig(t *testing.T) {
	h := startHost(t, staticBlock("static", "a.example.com"))
	h.rewrite(staticBlock("static", "a.example.com") + "plugin \"broken\" {\n  bundled = \"nope\"\n}\n")
	h.signal(syscall.SIGHUP)
	h.eventually("the reload to be rejected", 10*time.Second, func() bool {
		return strings.Contains(h.log.String(), "reload rejected")
	})
	if !strings.Contains(h.log.String(), "plugins.hcl:") || !strings.Contains(h.log.String(), `No bundled plugin is named "nope"`) {
		t.Errorf("rejection does not explain itself with a position:\n%s", h.log.String())
	}
	var r registryz
	h.getJSON("/debug/registryz", &r)
	if got := r.hostnames("static"); !slices.Equal(got, []string{"a.example.com"}) {
		t.Errorf("services after a rejected reload = %v", got)
	}

	// A valid file then applies.
	h.rewrite(staticBlock("static", "a.example.com", "c.example.com"))
	h.signal(syscall.SIGHUP)
	h.eventually("c.example.com", 10*time.Second, func() bool {
		var r registryz
		h.getJSON("/debug/registryz", &r)
		return slices.Contains(r.hostnames("static"), "c.example.com")
	})
}

func TestSameBundledPluginTwiceUnderTwoLabels(t *testing.T) {
	h := startHost(t, staticBlock("east", "a.example.com")+staticBlock("west", "a.example.com"))
	var r registryz
	h.getJSON("/debug/registryz", &r)
	if len(r.Instances) != 2 || r.Instances[0].Key.Plugin != "east" || r.Instances[1].Key.Plugin != "west" {
		t.Fatalf("instances = %+v, want east then west", r.Instances)
	}
}

func TestSIGTERMStopsEveryPlugin(t *testing.T) {
	h := startHost(t, staticBlock("one", "a.example.com")+staticBlock("two", "b.example.com"))
	_, p1, _ := h.plugin("one")
	_, p2, _ := h.plugin("two")
	h.signal(syscall.SIGTERM)
	select {
	case <-h.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("estuary did not exit within 10s of SIGTERM")
	}
	if code := h.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGTERM", code)
	}
	for _, pid := range []int{p1, p2} {
		if processAlive(pid) {
			t.Errorf("plugin pid %d still running after the host stopped", pid)
		}
	}
}

func TestHostSIGKILLLeavesNoOrphans(t *testing.T) {
	h := startHost(t, staticBlock("static", "a.example.com"))
	_, pid, _ := h.plugin("static")
	if !processAlive(pid) {
		t.Fatalf("plugin pid %d not running", pid)
	}
	h.signal(syscall.SIGKILL)
	<-h.exited
	deadline := time.Now().Add(5 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("plugin pid %d outlived its SIGKILLed host by 5s", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestValidateCommand(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/good.hcl"
	bad := dir + "/plugins.hcl"
	if err := os.WriteFile(good, []byte(staticBlock("static", "a.example.com")), 0o644); err != nil {
		t.Fatal(err)
	}
	badSrc := `xds {
  listen = "127.0.0.1:notaport"
}
plugin "static" {
  config {
    cluster = 42
    service "a.example.com" {
      port "http" {
        protocol = "HTTP"
      }
    }
    colour = "blue"
  }
}
`
	if err := os.WriteFile(bad, []byte(badSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(estuaryBin, "validate", "-config", good).CombinedOutput()
	if err != nil {
		t.Fatalf("validate good: %v\n%s", err, out)
	}
	out, err = exec.Command(estuaryBin, "validate", "-config", bad).CombinedOutput()
	if err == nil {
		t.Fatalf("validate accepted a bad file:\n%s", out)
	}
	// The host block is checked first; fix it and the plugin block's
	// problems are all reported together.
	for _, want := range []string{"plugins.hcl:2:12: error: Invalid listen address"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if err := os.WriteFile(bad, []byte(strings.Replace(badSrc, "notaport", "15010", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ = exec.Command(estuaryBin, "validate", "-config", bad).CombinedOutput()
	for _, want := range []string{
		`plugins.hcl:12:5: error: Unsupported argument: An argument named "colour" is not expected here`,
		`plugins.hcl:8:19: error: Missing required argument: The argument "number" is required`,
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestAdminEndpoints(t *testing.T) {
	h := startHost(t, staticBlock("static", "a.example.com"))
	if code, body := h.get("/healthz"); code != 200 || !strings.Contains(string(body), "ok") {
		t.Errorf("/healthz = %d %q", code, body)
	}
	code, body := h.get("/metrics")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	for _, want := range []string{
		`estuary_registry_instances{plugin="static",provider="Static"} 1`,
		`estuary_registry_events_total{kind="service_upserted",plugin="static"} 1`,
		`estuary_plugin_up{plugin="static"} 1`,
		"estuary_plugin_restarts_total",
		"estuary_xds_clients 0",
		"estuary_aggregate_conflicts",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	var cfg struct {
		Mesh struct {
			ClusterID string `json:"cluster_id"`
		} `json:"mesh"`
		XDS struct {
			Listen string `json:"listen"`
		} `json:"xds"`
		Plugins []struct {
			Label  string         `json:"label"`
			Config map[string]any `json:"config"`
		} `json:"plugins"`
	}
	h.getJSON("/debug/configz", &cfg)
	if cfg.Mesh.ClusterID != "cluster1" || cfg.XDS.Listen != h.xds || len(cfg.Plugins) != 1 || cfg.Plugins[0].Config["cluster"] != "static-cluster" {
		t.Errorf("/debug/configz = %+v", cfg)
	}
}
