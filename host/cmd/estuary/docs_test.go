package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/estuary-mesh/estuary/host/config"
	"github.com/estuary-mesh/estuary/sdk"
)

// repoRoot is the repository, seen from this package.
const repoRoot = "../../.."

// fragmentMarker starts an HTML comment, on the line before a ```hcl fence,
// saying the block cannot be validated as it stands: a piece of a
// plugins.hcl, or one that names files the reader provides (an external
// plugin's binary and its hash). The comment may say why:
// <!-- hcl:fragment: the path and hash are yours -->. Such a block is only
// parsed as HCL, with every "..." taken as elided text. Every other HCL
// block in a README is a complete plugins.hcl and must pass what `estuary
// validate` checks.
const fragmentMarker = "<!-- hcl:fragment"

// example is one HCL text the repository documents.
type example struct {
	file     string // relative to the repository
	line     int    // of its first line in file
	src      []byte
	fragment bool
}

// TestDocumentedConfigs: every HCL block of every README.md, every .hcl
// file under examples/ and the repository's plugins.hcl are what `estuary
// validate` accepts (the host's checks, the bundled plugins' schemas, the
// networks block), so no example can drift from the code. Errors point at
// the README's own lines.
func TestDocumentedConfigs(t *testing.T) {
	examples := documentedConfigs(t)
	full := 0
	for _, ex := range examples {
		if !ex.fragment {
			full++
		}
		t.Run(fmt.Sprintf("%s:%d", ex.file, ex.line), func(t *testing.T) {
			if diags := checkExample(ex); diags.HasErrors() {
				hint := ""
				if !ex.fragment && strings.HasSuffix(ex.file, ".md") {
					hint = "\n(a block that is not a complete plugins.hcl needs " + fragmentMarker + " --> on the line before its fence)"
				}
				t.Errorf("%s%s", config.Format(diags), hint)
			}
		})
	}
	// A scan that finds nothing would pass; the repository has at least
	// the examples' files, the plugins' READMEs and the root README.
	if full < 12 || len(examples) < 14 {
		t.Errorf("found %d examples (%d complete), expected more: is the scan broken?", len(examples), full)
	}
}

// checkExample validates a complete example, or parses a fragment.
func checkExample(ex example) hcl.Diagnostics {
	// Pad with newlines so positions are the file's own lines.
	src := append(bytes.Repeat([]byte("\n"), ex.line-1), ex.src...)
	name := filepath.Join(repoRoot, ex.file)
	if ex.fragment {
		_, diags := hclsyntax.ParseConfig(bytes.ReplaceAll(src, []byte("..."), nil), name, hcl.InitialPos)
		return diags
	}
	_, diags := validated(config.Parse(name, src, catalog.Names()))
	return diags
}

func documentedConfigs(t *testing.T) []example {
	t.Helper()
	var out []example
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, path)
		switch {
		case d.IsDir() && rel != "." && strings.HasPrefix(d.Name(), "."):
			return filepath.SkipDir
		case d.IsDir():
			return nil
		case d.Name() == "README.md":
			blocks, err := hclBlocks(path, rel)
			out = append(out, blocks...)
			return err
		case strings.HasSuffix(d.Name(), ".hcl") && (strings.HasPrefix(rel, "examples"+string(filepath.Separator)) || rel == "plugins.hcl"):
			src, err := os.ReadFile(path)
			out = append(out, example{file: rel, line: 1, src: src})
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// hclBlocks returns the ```hcl blocks of a Markdown file.
func hclBlocks(path, rel string) ([]example, error) {
	blocks, err := fencedBlocks(path, rel)
	var out []example
	for _, b := range blocks {
		if b.lang == "hcl" {
			out = append(out, example{file: rel, line: b.line + 1, src: []byte(b.text), fragment: strings.HasPrefix(b.previous, fragmentMarker)})
		}
	}
	return out, err
}

// fenced is one fenced block of a Markdown file.
type fenced struct {
	lang     string // after the opening ```
	line     int    // of the opening fence
	previous string // the last non-empty line before the fence, trimmed
	text     string
}

// fencedBlocks returns the fenced blocks of a Markdown file that name a
// language; rel names the file in errors.
func fencedBlocks(path, rel string) ([]fenced, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		out      []fenced
		cur      *fenced
		previous string
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```") && len(trimmed) > 3:
			cur = &fenced{lang: trimmed[3:], line: n, previous: previous}
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		case trimmed != "":
			previous = trimmed
		}
	}
	if cur != nil {
		return out, fmt.Errorf("%s:%d: ```%s block never closed", rel, cur.line, cur.lang)
	}
	return out, sc.Err()
}

// TestPluginREADMEs: each bundled plugin's README has the one skeleton
// (CoreDNS-style) and its Config section names every attribute and block
// of the schema the plugin declares.
func TestPluginREADMEs(t *testing.T) {
	sections := []string{"## Config", "## Instances", "## Health and notices", "## Metrics", "## Examples"}
	for _, name := range catalog.Names() {
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(repoRoot, "plugins", name, "README.md"))
			if err != nil {
				t.Fatal(err)
			}
			doc := string(b)
			if !strings.HasPrefix(doc, "# "+name+"\n") {
				t.Errorf("README does not start with the title \"# %s\"", name)
			}
			var at []int
			for _, s := range sections {
				i := strings.Index(doc, "\n"+s+"\n")
				if i < 0 {
					t.Errorf("README lacks the section %q", s)
				}
				at = append(at, i)
			}
			for i := 1; i < len(at); i++ {
				if at[i-1] >= 0 && at[i] >= 0 && at[i-1] > at[i] {
					t.Errorf("section %q comes before %q; the order is %q", sections[i], sections[i-1], sections)
				}
			}
			if at[0] < 0 || at[1] < 0 {
				return
			}
			configSection := doc[at[0]:at[1]]
			d, err := catalog.Describe(name)
			if err != nil {
				t.Fatal(err)
			}
			for _, attr := range schemaNames(d.ConfigSchema) {
				if !strings.Contains(configSection, "`"+attr+"`") && !strings.Contains(configSection, "`"+attr+" ") &&
					!strings.Contains(configSection, "."+attr+"`") {
					t.Errorf("## Config does not document %q", attr)
				}
			}
		})
	}
}

// schemaNames lists the attributes and block types of a schema, nested
// ones included.
func schemaNames(s *sdk.Schema) []string {
	if s == nil {
		return nil
	}
	var out []string
	for _, a := range s.Attributes {
		out = append(out, a.Name)
	}
	for _, b := range s.Blocks {
		out = append(out, b.TypeName)
		out = append(out, schemaNames(&b.Body)...)
	}
	return out
}
