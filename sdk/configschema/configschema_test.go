package configschema_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	registryv1 "github.com/estuary-mesh/estuary/proto/registry/v1"
	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
)

func TestParseType(t *testing.T) {
	tests := []struct {
		in   string
		want cty.Type
		err  string
	}{
		{in: "", want: cty.String},
		{in: "string", want: cty.String},
		{in: "number", want: cty.Number},
		{in: "bool", want: cty.Bool},
		{in: "list(string)", want: cty.List(cty.String)},
		{in: "list(number)", want: cty.List(cty.Number)},
		{in: "map(string)", want: cty.Map(cty.String)},
		{in: "map(number)", want: cty.Map(cty.Number)},
		{in: "map(list(string))", want: cty.Map(cty.List(cty.String))},
		{in: "set(string)", want: cty.Set(cty.String)},
		{in: "lst(string)", err: `type "lst(string)": type:1,1-12: Invalid type specification; Keyword "lst" is not a valid type constructor.`},
		{in: "list(", err: `type "list(": `},
		{in: "strin", err: `type "strin": type:1,1-6: Invalid type specification; The keyword "strin" is not a valid type specification.`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := configschema.ParseType(tt.in)
			if tt.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.err) {
					t.Fatalf("err = %v, want prefix %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !got.Equals(tt.want) {
				t.Errorf("type = %s, want %s", got.FriendlyName(), tt.want.FriendlyName())
			}
		})
	}
}

func TestSpecErrors(t *testing.T) {
	tests := []struct {
		name   string
		schema sdk.Schema
		err    string
	}{
		{"attribute twice", sdk.Schema{Attributes: []sdk.Attribute{{Name: "a"}, {Name: "a"}}}, `schema: "a" is declared twice`},
		{"block named like an attribute", sdk.Schema{Attributes: []sdk.Attribute{{Name: "a"}}, Blocks: []sdk.Block{{TypeName: "a"}}}, `schema: "a" is declared twice`},
		{"label named like an attribute", sdk.Schema{Blocks: []sdk.Block{{TypeName: "port", Labels: []string{"name"},
			Body: sdk.Schema{Attributes: []sdk.Attribute{{Name: "name"}}}}}}, `block "port": schema: "name" is declared twice`},
		{"bad nested type", sdk.Schema{Blocks: []sdk.Block{{TypeName: "port",
			Body: sdk.Schema{Attributes: []sdk.Attribute{{Name: "number", Type: "integer"}}}}}}, `block "port": schema: attribute "number": type "integer"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := configschema.Spec(&tt.schema)
			if err == nil || !strings.HasPrefix(err.Error(), tt.err) {
				t.Fatalf("err = %v, want prefix %q", err, tt.err)
			}
			// Decode reports the plugin's mistake rather than the user's.
			_, diags := configschema.ParseHCL("c.hcl", nil, &tt.schema)
			if len(diags) != 1 || diags[0].Summary != "Plugin declared an invalid config schema" || !strings.HasPrefix(diags[0].Detail, tt.err) {
				t.Errorf("Decode diagnostics = %v", diags)
			}
		})
	}
}

var schema = &sdk.Schema{
	Attributes: []sdk.Attribute{
		{Name: "cluster", Type: "string", Required: true},
		{Name: "network", Type: "string"},
		{Name: "tags", Type: "list(string)"},
		{Name: "weights", Type: "map(number)"},
		{Name: "enabled", Type: "bool"},
	},
	Blocks: []sdk.Block{
		{TypeName: "service", Labels: []string{"hostname"}, Body: sdk.Schema{
			Attributes: []sdk.Attribute{{Name: "namespace", Type: "string"}},
			Blocks: []sdk.Block{
				{TypeName: "port", Labels: []string{"name"}, Body: sdk.Schema{Attributes: []sdk.Attribute{
					{Name: "number", Type: "number", Required: true},
				}}},
			},
		}},
		{TypeName: "tls", Single: true, Body: sdk.Schema{Attributes: []sdk.Attribute{{Name: "ca_file", Type: "string"}}}},
	},
}

// TestDecodeJSON checks the JSON a plugin's Configure receives: every
// attribute present (null when unset), blocks as arrays, labels as members
// named after the schema's label names.
func TestDecodeJSON(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{{
		name: "everything",
		src: `
cluster = "c1"
tags    = ["a", "b"]
weights = { a = 1, b = 2.5 }
enabled = true
service "echo.example.com" {
  namespace = "default"
  port "http" { number = 80 }
  port "grpc" { number = 9090 }
}
service "db.example.com" {}
tls {
  ca_file = "/etc/ca.pem"
}
`,
		want: `{"cluster":"c1","enabled":true,"network":null,"service":[` +
			`{"hostname":"echo.example.com","namespace":"default","port":[{"name":"http","number":80},{"name":"grpc","number":9090}]},` +
			`{"hostname":"db.example.com","namespace":null,"port":[]}],` +
			`"tags":["a","b"],"tls":[{"ca_file":"/etc/ca.pem"}],"weights":{"a":1,"b":2.5}}`,
	}, {
		name: "minimal",
		src:  `cluster = "c1"`,
		want: `{"cluster":"c1","enabled":null,"network":null,"service":[],"tags":null,"tls":[],"weights":null}`,
	}, {
		name: "values converted to the declared type",
		src: `cluster = 7
tags = [1, true]
`,
		want: `{"cluster":"7","enabled":null,"network":null,"service":[],"tags":["1","true"],"tls":[],"weights":null}`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			js, diags := configschema.ParseHCL("c.hcl", []byte(tt.src), schema)
			if diags.HasErrors() {
				t.Fatal(diags.Error())
			}
			if string(js) != tt.want {
				t.Errorf("JSON:\n got %s\nwant %s", js, tt.want)
			}
			// And it decodes into the struct a plugin would write.
			var cfg struct {
				Cluster  string  `json:"cluster"`
				Network  *string `json:"network"`
				Services []struct {
					Hostname string `json:"hostname"`
					Ports    []struct {
						Name   string  `json:"name"`
						Number float64 `json:"number"`
					} `json:"port"`
				} `json:"service"`
			}
			if err := (&sdk.ConfigureRequest{ConfigJSON: js}).Decode(&cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.Cluster == "" || cfg.Network != nil {
				t.Errorf("decoded cluster %q network %v", cfg.Cluster, cfg.Network)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{{
		name: "single block twice",
		src: `cluster = "c1"
tls {}
tls {}
`,
		want: []string{`c.hcl:3,5-5: Too many tls blocks; No more than 1 "tls" blocks are allowed`},
	}, {
		name: "missing required attribute and wrong nested type, in file order",
		src: `service "a" {
  port "http" { number = "x" }
}
`,
		want: []string{
			`c.hcl:1,1-1: Missing required argument; The argument "cluster" is required, but no definition was found.`,
			`c.hcl:2,26-29: Incorrect attribute value type; Inappropriate value for attribute "number": a number is required.`,
		},
	}, {
		name: "map of the wrong element type",
		src: `cluster = "c1"
weights = { a = "heavy" }
`,
		want: []string{`c.hcl:2,11-26: Incorrect attribute value type; Inappropriate value for attribute "weights": a number is required.`},
	}, {
		name: "syntax error",
		src:  `cluster = `,
		want: []string{`c.hcl:1,11-11: Missing expression; Expected the start of an expression, but found the end of the file.`},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			js, diags := configschema.ParseHCL("c.hcl", []byte(tt.src), schema)
			if js != nil {
				t.Errorf("JSON returned despite errors: %s", js)
			}
			var got []string
			for _, d := range diags {
				got = append(got, d.Error())
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("diagnostics:\n got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestPathRange(t *testing.T) {
	const src = `cluster = "c1"
service "a.example.com" {
  port "http" {
    number = 80
  }
}
service "b.example.com" {
  namespace = "b"
  port "http" {
    number = 80
  }
  port "grpc" {
    number = 0
  }
}
tls {
}
`
	f, diags := hclsyntax.ParseConfig([]byte(src), "c.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	tests := []struct {
		path      []string
		line, col int
	}{
		{nil, 1, 1},
		{[]string{"cluster"}, 1, 1},
		{[]string{"service", "1", "port", "1", "number"}, 13, 5},
		{[]string{"service", "0", "port", "0", "number"}, 4, 5},
		{[]string{"service", "1", "namespace"}, 8, 3},
		// A block without an index means the first.
		{[]string{"tls"}, 16, 1},
		{[]string{"service", "port", "number"}, 4, 5},
		// Unset attribute: the enclosing block.
		{[]string{"service", "1", "port", "1", "protocol"}, 12, 3},
		// Block index out of range: the deepest block found.
		{[]string{"service", "5", "port"}, 1, 1},
		{[]string{"service", "1", "port", "2", "number"}, 7, 1},
		// An attribute with an element index: the attribute.
		{[]string{"service", "1", "namespace", "0"}, 8, 3},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.path, "."), func(t *testing.T) {
			r := configschema.PathRange(f.Body, tt.path)
			if r.Filename != "c.hcl" || r.Start.Line != tt.line || r.Start.Column != tt.col {
				t.Errorf("PathRange = %s:%d:%d, want c.hcl:%d:%d", r.Filename, r.Start.Line, r.Start.Column, tt.line, tt.col)
			}
		})
	}
}

func TestFromProto(t *testing.T) {
	p := &registryv1.Schema{
		Attributes: []*registryv1.Attribute{{Name: "cluster", Type: "string", Required: true, Description: "the cluster"}},
		Blocks: []*registryv1.Block{
			{TypeName: "service", Labels: []string{"hostname"}, Nesting: registryv1.Nesting_NESTING_LIST, Description: "a service",
				Body: &registryv1.Schema{Attributes: []*registryv1.Attribute{{Name: "ports", Type: "map(number)"}}}},
			{TypeName: "tls", Nesting: registryv1.Nesting_NESTING_SINGLE},
		},
	}
	want := &sdk.Schema{
		Attributes: []sdk.Attribute{{Name: "cluster", Type: "string", Required: true, Description: "the cluster"}},
		Blocks: []sdk.Block{
			{TypeName: "service", Labels: []string{"hostname"}, Description: "a service",
				Body: sdk.Schema{Attributes: []sdk.Attribute{{Name: "ports", Type: "map(number)"}}}},
			{TypeName: "tls", Single: true, Body: sdk.Schema{}},
		},
	}
	got := configschema.FromProto(p)
	if !reflect.DeepEqual(got, want) {
		a, _ := json.Marshal(got)
		b, _ := json.Marshal(want)
		t.Errorf("FromProto:\n got %s\nwant %s", a, b)
	}
}

func TestDurationAttribute(t *testing.T) {
	schema := &sdk.Schema{
		Attributes: []sdk.Attribute{{Name: "wait_time", Type: sdk.TypeDuration}},
		Blocks: []sdk.Block{{TypeName: "remote", Body: sdk.Schema{
			Attributes: []sdk.Attribute{{Name: "timeout", Type: sdk.TypeDuration, Required: true}},
		}}},
	}
	type decoded struct {
		WaitTime *sdk.Duration `json:"wait_time"`
	}
	type problem struct{ at, has string } // "LINE:COL", part of "summary: detail"
	tests := []struct {
		name string
		src  string
		want time.Duration // of wait_time; 0 when unset
		errs []problem     // in file order
	}{
		{name: "unset stays null", src: ``},
		{name: "seconds", src: `wait_time = "30s"`, want: 30 * time.Second},
		{name: "compound", src: `wait_time = "1h30m"`, want: 90 * time.Minute},
		{name: "bad unit", src: "\nwait_time = \"5 minutes\"", errs: []problem{{"2:13", `Invalid duration: wait_time: "5 minutes" is not a duration such as "30s"`}}},
		{name: "a bare number has no unit", src: `wait_time = 30`, errs: []problem{{"1:13", `wait_time: "30" is not a duration`}}},
		{name: "wrong type", src: `wait_time = ["1s"]`, errs: []problem{{"1:13", `Incorrect attribute value type`}}},
		{name: "every problem, nested too", src: "wait_time = \"x\"\nremote {\n  timeout = \"1d\"\n}\nremote {}",
			errs: []problem{{"1:13", `wait_time: "x"`}, {"3:13", `timeout: "1d"`}, {"5:8", `"timeout" is required`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			js, diags := configschema.ParseHCL("plugins.hcl", []byte(tt.src), schema)
			if len(diags) != len(tt.errs) {
				t.Fatalf("diagnostics = %v, want %d: %v", diags, len(tt.errs), tt.errs)
			}
			for i, d := range diags {
				at := fmt.Sprintf("%d:%d", d.Subject.Start.Line, d.Subject.Start.Column)
				text := d.Summary + ": " + d.Detail
				if at != tt.errs[i].at || !strings.Contains(text, tt.errs[i].has) {
					t.Errorf("diagnostic %d = %s %q, want %s %q", i, at, text, tt.errs[i].at, tt.errs[i].has)
				}
			}
			if len(tt.errs) > 0 {
				return
			}
			var d decoded
			if err := json.Unmarshal(js, &d); err != nil {
				t.Fatalf("plugin cannot decode %s: %v", js, err)
			}
			switch {
			case tt.want == 0 && d.WaitTime != nil:
				t.Errorf("wait_time = %v, want unset (nil)", d.WaitTime)
			case tt.want != 0 && (d.WaitTime == nil || d.WaitTime.Duration != tt.want):
				t.Errorf("wait_time = %v, want %v", d.WaitTime, tt.want)
			}
		})
	}
}

func TestDurationJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{in: `"250ms"`, want: 250 * time.Millisecond},
		{in: `"-5s"`, want: -5 * time.Second},
		{in: `"soon"`, err: `"soon" is not a duration such as "30s"`},
		{in: `30`, err: `duration: want a string`},
	} {
		var d sdk.Duration
		err := json.Unmarshal([]byte(tc.in), &d)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("Unmarshal(%s) error = %v, want %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || d.Duration != tc.want):
			t.Errorf("Unmarshal(%s) = %v, %v; want %v", tc.in, d, err, tc.want)
		}
		if tc.err == "" {
			back, _ := json.Marshal(d)
			var again sdk.Duration
			if err := json.Unmarshal(back, &again); err != nil || again != d {
				t.Errorf("round trip of %v through %s = %v, %v", d, back, again, err)
			}
		}
	}
}

// TestEqual: the host reuses a block decoded against a bundled plugin's
// in-process schema when the running plugin describes an Equal one over
// the wire, so Equal must hold across FromProto (nil and empty lists) and
// fail on any difference that changes decoding.
func TestEqual(t *testing.T) {
	schema := func() *sdk.Schema {
		return &sdk.Schema{
			Attributes: []sdk.Attribute{{Name: "cluster", Type: "string"}, {Name: "token", Type: "string", Sensitive: true}},
			Blocks: []sdk.Block{{TypeName: "service", Labels: []string{"hostname"}, Body: sdk.Schema{
				Attributes: []sdk.Attribute{{Name: "addresses", Type: "list(string)"}},
				Blocks:     []sdk.Block{{TypeName: "endpoint", Labels: []string{}, Body: sdk.Schema{Attributes: []sdk.Attribute{{Name: "address", Required: true}}}}},
			}}},
		}
	}
	wire := &registryv1.Schema{
		Attributes: []*registryv1.Attribute{{Name: "cluster", Type: "string"}, {Name: "token", Type: "string", Sensitive: true}},
		Blocks: []*registryv1.Block{{TypeName: "service", Labels: []string{"hostname"}, Body: &registryv1.Schema{
			Attributes: []*registryv1.Attribute{{Name: "addresses", Type: "list(string)"}},
			Blocks:     []*registryv1.Block{{TypeName: "endpoint", Body: &registryv1.Schema{Attributes: []*registryv1.Attribute{{Name: "address", Required: true}}}}},
		}}},
	}
	if !configschema.Equal(schema(), configschema.FromProto(wire)) {
		t.Errorf("a schema and its wire form are not Equal")
	}
	if !configschema.Equal(nil, nil) || configschema.Equal(schema(), nil) {
		t.Errorf("Equal with nil schemas is wrong")
	}
	for name, change := range map[string]func(*sdk.Schema){
		"attribute type":   func(s *sdk.Schema) { s.Attributes[0].Type = "number" },
		"sensitive":        func(s *sdk.Schema) { s.Attributes[1].Sensitive = false },
		"attribute gone":   func(s *sdk.Schema) { s.Attributes = s.Attributes[:1] },
		"label":            func(s *sdk.Schema) { s.Blocks[0].Labels = nil },
		"single":           func(s *sdk.Schema) { s.Blocks[0].Single = true },
		"nested required":  func(s *sdk.Schema) { s.Blocks[0].Body.Blocks[0].Body.Attributes[0].Required = false },
		"nested attribute": func(s *sdk.Schema) { s.Blocks[0].Body.Attributes[0].Name = "vips" },
	} {
		s := schema()
		change(s)
		if configschema.Equal(schema(), s) || configschema.Equal(s, schema()) {
			t.Errorf("%s changed, but the schemas are Equal", name)
		}
	}
}
