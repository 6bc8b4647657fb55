package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/sdk"
)

// TestConfigzShowsTheRunningBlock: /debug/configz shows the block a plugin
// runs. While the plugin keeps an earlier block (it refused the file's),
// the file's block is shown apart, not as running.
func TestConfigzShowsTheRunningBlock(t *testing.T) {
	schema := &sdk.Schema{Attributes: []sdk.Attribute{{Name: "port", Type: "number"}}}
	file := &config.Plugin{Label: "a", Bundled: "static", ConfigJSON: []byte(`{"port":70000}`), Schema: schema}
	ran := &config.Plugin{Label: "a", Bundled: "static", ConfigJSON: []byte(`{"port":81}`), Schema: schema}
	tests := []struct {
		name    string
		run     *config.Plugin
		latest  bool
		want    string
		running bool
		file    string // the file's block shown apart, if any
	}{
		{name: "not started", want: `{"port":70000}`},
		{name: "runs the file's block", run: file, latest: true, want: `{"port":70000}`, running: true},
		{name: "refused the file's block", run: ran, want: `{"port":81}`, running: true, file: `{"port":70000}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			view := effectiveConfig(&config.File{Plugins: []*config.Plugin{file}}, func(string) (*config.Plugin, bool) { return tt.run, tt.latest })
			b, err := json.Marshal(view)
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Plugins []struct {
					Config  json.RawMessage `json:"config"`
					Running bool            `json:"running"`
					File    *struct {
						Config json.RawMessage `json:"config"`
					} `json:"file"`
				} `json:"plugins"`
			}
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			p := got.Plugins[0]
			gotFile := ""
			if p.File != nil {
				gotFile = string(p.File.Config)
			}
			if string(p.Config) != tt.want || p.Running != tt.running || gotFile != tt.file {
				t.Errorf("configz plugin = %s", b)
			}
		})
	}
}

// TestConfigzHidesSecretsAndReadsDurations: configz writes durations as
// plugins.hcl does, hides sensitive attributes and env values, and strips
// URL credentials.
func TestConfigzHidesSecretsAndReadsDurations(t *testing.T) {
	schema := &sdk.Schema{Attributes: []sdk.Attribute{{Name: "token", Sensitive: true}, {Name: "address"}}}
	p := &config.Plugin{Label: "c", Bundled: "consul", SyncTimeout: 45 * time.Second, Env: map[string]string{"CONSUL_HTTP_TOKEN": "env-secret-1"},
		ConfigJSON: []byte(`{"token":"tok-secret-2","address":"https://u:pw-secret-3@h:8501"}`), Schema: schema}
	f := &config.File{XDS: config.XDS{DebounceAfter: 100 * time.Millisecond, MaxConnectionAge: 30 * time.Minute}, Plugins: []*config.Plugin{p}}
	b, err := json.Marshal(effectiveConfig(f, func(string) (*config.Plugin, bool) { return nil, false }))
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{`"debounce_after":"100ms"`, `"max_connection_age":"30m0s"`, `"sync_timeout":"45s"`,
		`"token":"(sensitive)"`, `"address":"https://redacted@h:8501"`, `"env":["CONSUL_HTTP_TOKEN=(redacted)"]`} {
		if !strings.Contains(got, want) {
			t.Errorf("configz lacks %s:\n%s", want, got)
		}
	}
	if strings.Contains(got, "secret") {
		t.Errorf("configz shows a secret:\n%s", got)
	}
}
