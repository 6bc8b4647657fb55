package configschema

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/estuary-mesh/estuary/sdk"
)

var cacheSchema = &sdk.Schema{
	Attributes: []sdk.Attribute{{Name: "cluster", Type: "string"}},
	Blocks: []sdk.Block{{TypeName: "service", Labels: []string{"hostname"}, Body: sdk.Schema{
		Attributes: []sdk.Attribute{{Name: "port", Type: "number", Required: true}},
		Blocks:     []sdk.Block{{TypeName: "endpoint", Body: sdk.Schema{Attributes: []sdk.Attribute{{Name: "address", Type: "string", Required: true}}}}},
	}}},
}

func services(ports ...string) string {
	var b strings.Builder
	b.WriteString("cluster = \"c\"\n")
	for i, p := range ports {
		fmt.Fprintf(&b, "service \"s%d\" {\n  port = %s\n  endpoint { address = \"10.0.0.%d\" }\n}\n", i, p, i)
	}
	return b.String()
}

// cached decodes src with c and checks the result against Decode
// without a cache: the same JSON, the same diagnostics.
func cached(t *testing.T, c *Cache, src string) hcl.Diagnostics {
	t.Helper()
	f, diags := hclsyntax.ParseConfig([]byte(src), "c.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	got, gotDiags := c.Decode(f.Body, []byte(src), cacheSchema)
	want, wantDiags := Decode(f.Body, cacheSchema)
	if string(got) != string(want) {
		t.Errorf("cached JSON:\n got %s\nwant %s", got, want)
	}
	if gotDiags.Error() != wantDiags.Error() {
		t.Errorf("cached diagnostics:\n got %s\nwant %s", gotDiags.Error(), wantDiags.Error())
	}
	return gotDiags
}

func TestCacheDecodesOnlyChangedBlocks(t *testing.T) {
	c := &Cache{}
	cached(t, c, services("80", "81", "82"))
	if len(c.blocks) != 3 {
		t.Fatalf("cache holds %d blocks, want 3", len(c.blocks))
	}
	// Poison the entry of an unchanged block: served from the cache, it
	// shows in the result, which proves the block was not decoded again.
	src := services("80", "90", "82")
	var poisoned string
	for k := range c.blocks {
		if strings.Contains(k, `"s2"`) {
			poisoned = k
			c.blocks[k] = []byte(`{"hostname":"poison"}`)
		}
	}
	f, _ := hclsyntax.ParseConfig([]byte(src), "c.hcl", hcl.InitialPos)
	js, diags := c.Decode(f.Body, []byte(src), cacheSchema)
	if diags.HasErrors() || !strings.Contains(string(js), "poison") || !strings.Contains(string(js), `"port":90`) {
		t.Fatalf("JSON = %s (%v): want the changed block decoded and the unchanged one from the cache", js, diags)
	}
	delete(c.blocks, poisoned)
	// Blocks the file no longer holds are forgotten.
	cached(t, c, services("80"))
	if len(c.blocks) != 1 {
		t.Errorf("cache holds %d blocks after the file lost two, want 1", len(c.blocks))
	}
}

func TestCacheKeepsErrorsAndPositions(t *testing.T) {
	c := &Cache{}
	cached(t, c, services("80", "81"))
	// An error in a new block, after blocks the cache holds, and blocks
	// moved by a new first one: positioned as without a cache.
	d := cached(t, c, "# moved\n\n"+services("80", `"x"`, "81"))
	if !d.HasErrors() || d[0].Subject.Start.Line != 9 {
		t.Fatalf("diagnostics = %v, want an error at line 9", d)
	}
	// A block with an error is never kept: decoded again, it fails again.
	d = cached(t, c, services("80", `"x"`))
	if !d.HasErrors() {
		t.Fatal("the bad block decoded from the cache")
	}
	// A different schema takes nothing from the cache.
	cached(t, c, services("80"))
	other := &sdk.Schema{Blocks: []sdk.Block{{TypeName: "service", Labels: []string{"hostname"}, Body: sdk.Schema{
		Attributes: []sdk.Attribute{{Name: "port", Type: "string", Required: true}},
		Blocks:     cacheSchema.Blocks[0].Body.Blocks,
	}}}, Attributes: cacheSchema.Attributes}
	f, _ := hclsyntax.ParseConfig([]byte(services("80")), "c.hcl", hcl.InitialPos)
	js, _ := c.Decode(f.Body, []byte(services("80")), other)
	if !strings.Contains(string(js), `"port":"80"`) {
		t.Errorf("JSON = %s: decoded against the previous schema", js)
	}
}
