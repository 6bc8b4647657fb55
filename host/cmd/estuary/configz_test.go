package main

import (
	"encoding/json"
	"testing"

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
