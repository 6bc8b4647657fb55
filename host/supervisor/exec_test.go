package supervisor

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/pluginclient"
)

// copyBinary copies this test binary to dir/name, mode 0755, for a plugin
// block of its own.
func copyBinary(t *testing.T, dir, name string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(dir, name)
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSwappedBinaryNeverRuns: a binary swapped in at the plugin's path
// after the host checked and hashed it is never executed: the process
// that starts is the one hashed. The impostor would leave a marker file
// and fail the handshake.
func TestSwappedBinaryNeverRuns(t *testing.T) {
	dir := t.TempDir()
	path := copyBinary(t, dir, "plugin")
	cfg := selfPlugin(t, "swap", "ok", "")
	cfg.Path, cfg.SHA256 = path, fileSHA256(t, path)

	bin, diags := config.OpenBinary(cfg)
	if diags.HasErrors() {
		t.Fatal(config.Format(diags))
	}
	defer bin.Close()

	// The swap: a script renamed over the checked path, as an attacker
	// with write access to the directory would.
	marker := filepath.Join(dir, "impostor-ran")
	impostor := filepath.Join(dir, "impostor")
	if err := os.WriteFile(impostor, []byte("#!/bin/sh\ntouch "+marker+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(impostor, path); err != nil {
		t.Fatal(err)
	}

	sup, _ := newTestSupervisor(t)
	r := newRunner(sup, cfg, config.Mesh{})
	client := goplugin.NewClient(r.clientConfig(cfg, bin, io.Discard))
	defer client.Kill()
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("the hashed binary did not start: %v", err)
	}
	raw, err := rpc.Dispense(sdk.PluginName)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := raw.(*pluginclient.Client).Describe(ctx, &pluginclient.DescribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "ok" {
		t.Errorf("the plugin that runs says it is %q, want the hashed test plugin", d.Name)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the binary swapped in after the check was executed")
	}
}

// TestPluginEnvironmentIsNotInherited: a plugin, external or bundled,
// sees its env block and the allowed variables of the host's environment
// (PATH, TZ, ...), not the rest; its env block wins over the host's
// value. The plugin processes report what they really got.
func TestPluginEnvironmentIsNotInherited(t *testing.T) {
	t.Setenv("ESTUARY_HOST_ONLY_SECRET", "host-secret-value")
	t.Setenv("TZ", "UTC")
	t.Setenv("LANG", "C.UTF-8")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		block func(out string) *config.Plugin
	}{
		{"external", func(out string) *config.Plugin {
			p := selfPlugin(t, "external", "env", "")
			p.Env["ESTUARY_TEST_ENV_OUT"], p.Env["TZ"] = out, "Europe/Paris"
			return p
		}},
		{"bundled", func(out string) *config.Plugin {
			// A bundled plugin re-executes the host's own image, here
			// this test binary, which serves the mode its env names.
			return &config.Plugin{Label: "bundled", Bundled: "env", Config: parseBody(t, ""), SyncTimeout: config.DefaultSyncTimeout,
				Env: map[string]string{"ESTUARY_TEST_PLUGIN": "env", "ESTUARY_TEST_ENV_OUT": out, "TZ": "Europe/Paris"}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "env")
			sup, _ := newTestSupervisorWith(t, Options{Self: self})
			p := tt.block(out)
			if d := sup.Apply(&config.File{Plugins: []*config.Plugin{p}}); d.HasErrors() {
				t.Fatal(d)
			}
			waitStatus(t, sup, p.Label, "running", func(s Status) bool { return s.State == StateRunning })
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			env := strings.Split(string(b), "\n")
			var tz []string
			for _, kv := range env {
				if strings.HasPrefix(kv, "TZ=") {
					tz = append(tz, kv)
				}
				if strings.Contains(kv, "ESTUARY_HOST_ONLY_SECRET") || strings.Contains(kv, "host-secret-value") {
					t.Errorf("the plugin inherited %q", kv)
				}
			}
			if !slices.Equal(tz, []string{"TZ=Europe/Paris"}) {
				t.Errorf("TZ in the plugin: %q, want only the env block's", tz)
			}
			for _, want := range []string{"LANG=C.UTF-8", "PATH=" + os.Getenv("PATH"), "ESTUARY_TEST_PLUGIN=env"} {
				if !slices.Contains(env, want) {
					t.Errorf("the plugin's environment lacks %q:\n%s", want, b)
				}
			}
		})
	}
}
