package configschema_test

import (
	"slices"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/configschema"
)

// richSchema has every kind of member the block decoder handles: labels,
// primitive and collection attributes, durations, nested block lists and
// single blocks, at several depths.
var richSchema = &sdk.Schema{
	Attributes: []sdk.Attribute{
		{Name: "cluster", Type: "string", Required: true},
		{Name: "tags", Type: "list(string)"},
		{Name: "set", Type: "set(string)"},
		{Name: "weights", Type: "map(number)"},
		{Name: "nested", Type: "map(list(string))"},
		{Name: "obj", Type: "object({a = string, b = optional(number)})"},
		{Name: "enabled", Type: "bool"},
		{Name: "ratio", Type: "number"},
		{Name: "timeout", Type: sdk.TypeDuration},
		{Name: "token", Type: "string", Sensitive: true},
	},
	Blocks: []sdk.Block{
		{TypeName: "service", Labels: []string{"hostname"}, Body: sdk.Schema{
			Attributes: []sdk.Attribute{{Name: "namespace", Type: "string"}, {Name: "interval", Type: sdk.TypeDuration, Required: true}},
			Blocks: []sdk.Block{
				{TypeName: "port", Labels: []string{"name", "proto"}, Body: sdk.Schema{Attributes: []sdk.Attribute{
					{Name: "number", Type: "number", Required: true},
				}}},
				{TypeName: "endpoint", Body: sdk.Schema{Attributes: []sdk.Attribute{
					{Name: "address", Type: "string", Required: true},
					{Name: "ports", Type: "map(number)"},
				}}},
			},
		}},
		{TypeName: "tls", Single: true, Body: sdk.Schema{Attributes: []sdk.Attribute{{Name: "ca_file", Type: "string"}}}},
	},
}

// TestBlockDecoderMatchesHCLDec holds the block decoder to hcldec and
// cty's JSON, which it replaces for speed: the same JSON, byte for byte,
// and the same diagnostics at the same positions, good input or bad.
func TestBlockDecoderMatchesHCLDec(t *testing.T) {
	spec, err := configschema.Spec(richSchema)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, src string }{
		{"empty", ``},
		{"minimal", `cluster = "c"`},
		{"everything", `
cluster = "c1 <&> \u00e9\t\"q\""
tags    = ["b", "a", 1, true, "<b>", "x>y"]
set     = ["z", "y", "z"]
weights = { b = 2.5, a = 1, huge = 1e40, neg = -3, frac = 0.1, big = 12345678901234567890 }
nested  = { k = ["x"], j = [] }
obj     = { a = "x" }
enabled = false
ratio   = 1.5e-7
timeout = "1m30s"
token   = "s3cret"
service "echo.example.com" {
  namespace = "default"
  interval  = "10s"
  port "http" "tcp" { number = 80 }
  port "grpc" "h2" {
    number = 9090
  }
  endpoint {
    address = "10.0.0.1"
    ports   = { http = 8080 }
  }
  endpoint { address = "10.0.0.2" }
}
service "db.example.com" { interval = "1s" }
tls {
  ca_file = "/etc/ca.pem"
}
`},
		{"wrong types and missing attributes", `
tags = "x"
weights = { a = "heavy" }
obj = { b = 1 }
service "a" {
  port "http" "tcp" { number = "x" }
  endpoint { ports = {} }
}
`},
		{"bad durations", `
cluster = "c"
timeout = "soon"
service "a" { interval = "-1s" }
service "b" { interval = 5 }
`},
		{"unknown attributes and blocks, bad labels", `
cluster = "c"
colour = "red"
service { interval = "1s" }
service "a" "b" { interval = "1s" }
service "c" {
  interval = "1s"
  port "only-one" { number = 1 }
  endpoint "label" { address = "x" }
  what {}
}
mystery {}
`},
		{"single block twice, thrice", `
cluster = "c"
tls {}
tls { ca_file = 1 }
tls {}
`},
		{"variables and functions are not allowed", `
cluster = var.x
tags = [upper("a")]
service "a" { interval = "${x}s" }
`},
		{"null values", `
cluster = null
tags = null
weights = { a = null }
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, diags := hclsyntax.ParseConfig([]byte(tt.src), "c.hcl", hcl.InitialPos)
			if diags.HasErrors() {
				t.Fatalf("test input does not parse: %s", diags.Error())
			}
			got, gotDiags := configschema.Decode(f.Body, richSchema)
			want, wantDiags := configschema.DecodeHCLDec(f.Body, spec)
			if string(got) != string(want) {
				t.Errorf("JSON:\n got %s\nwant %s", got, want)
			}
			if g, w := diagStrings(gotDiags), diagStrings(wantDiags); !slices.Equal(g, w) {
				t.Errorf("diagnostics:\n got %q\nwant %q", g, w)
			}
		})
	}
}

// diagStrings renders diagnostics with their positions. Their order is
// the file's; among those at one position hcldec's order is its map
// order, so those are compared sorted.
func diagStrings(diags hcl.Diagnostics) []string {
	var out []string
	for _, d := range diags {
		s := d.Error()
		if d.Context != nil {
			s += " (context " + d.Context.String() + ")"
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// TestBlockDecoderFallsBack checks that a schema with an attribute of
// type any, whose blocks hcldec unifies, still decodes (through hcldec).
func TestBlockDecoderFallsBack(t *testing.T) {
	s := &sdk.Schema{Blocks: []sdk.Block{{TypeName: "b", Body: sdk.Schema{Attributes: []sdk.Attribute{{Name: "v", Type: "any"}}}}}}
	js, diags := configschema.ParseHCL("c.hcl", []byte("b { v = 1 }\nb { v = \"x\" }\n"), s)
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	if want := `{"b":[{"v":"1"},{"v":"x"}]}`; string(js) != want {
		t.Errorf("JSON = %s, want %s", js, want)
	}
}
