package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The layering of DESIGN.md, as data. Each rule names the packages it
// governs (by path below the repository, a trailing "/" meaning the whole
// tree) and the trees they must not import. Test files count: a test that
// reaches into the host from a plugin couples them just the same.
//
// The command (host/cmd) is the one place that wires the host core and
// xds together, so no rule governs it.
var importRules = []struct {
	name      string
	from      []string
	forbidden []string
	except    []string // packages of `from` the rule does not govern
}{
	{
		name:      "the contract imports nothing of Estuary",
		from:      []string{"proto/"},
		forbidden: []string{"sdk/", "host/", "xds/", "plugins/", "examples/", "testbed/"},
	},
	{
		name:      "sdk, plugins and examples never import host or xds",
		from:      []string{"sdk/", "plugins/", "examples/"},
		forbidden: []string{"host/", "xds/"},
	},
	{
		name:      "the SDK never imports a plugin",
		from:      []string{"sdk/"},
		forbidden: []string{"plugins/", "examples/"},
	},
	{
		name:      "the host core never imports xds",
		from:      []string{"host/"},
		forbidden: []string{"xds/"},
		except:    []string{"host/cmd/"},
	},
	{
		name:      "xds never imports a plugin or the command",
		from:      []string{"xds/"},
		forbidden: []string{"plugins/", "examples/", "host/cmd/"},
	},
}

// pluginNames are the bundled plugins: nothing imports across them. Only
// plugins/bundled, which lists them all, and each plugin's own cmd may.
var pluginNames = []string{"consul", "kubernetes", "serviceentry", "static"}

const modulePrefix = "github.com/estuary-mesh/estuary/"

// modules are the repository's Go modules, relative to its root.
var modules = []string{".", "proto", "sdk", "examples/plugin-hello"}

// TestImportRules lists every package of every module with its imports
// (test imports included) and checks them against the rules above.
func TestImportRules(t *testing.T) {
	imports := repoImports(t)
	if len(imports) < 20 {
		t.Fatalf("found only %d packages; the listing is broken", len(imports))
	}
	for _, r := range importRules {
		for pkg, deps := range imports {
			if !underAny(pkg, r.from) || underAny(pkg, r.except) {
				continue
			}
			for _, d := range deps {
				if underAny(d, r.forbidden) {
					t.Errorf("%s: %s imports %s", r.name, pkg, d)
				}
			}
		}
	}
	for pkg, deps := range imports {
		own, ok := pluginOf(pkg)
		if !ok || pkg == "plugins/bundled" {
			continue
		}
		for _, d := range deps {
			if other, ok := pluginOf(d); ok && other != own {
				t.Errorf("nothing imports across plugins: %s imports %s", pkg, d)
			}
		}
	}
}

// TestImportRulesCatchViolations feeds the checker made-up imports, so that
// a rule that cannot fail is caught.
func TestImportRulesCatchViolations(t *testing.T) {
	cases := map[string]string{
		"plugins/consul":         "host/replica",
		"sdk/sdktest":            "xds",
		"host/network":           "xds",
		"xds":                    "plugins/static",
		"examples/plugin-hello":  "host/config",
		"proto/registry/v1":      "sdk",
		"plugins/kubernetes/cmd": "host/supervisor",
	}
	for from, to := range cases {
		hit := false
		for _, r := range importRules {
			if underAny(from, r.from) && !underAny(from, r.except) && underAny(to, r.forbidden) {
				hit = true
			}
		}
		if !hit {
			t.Errorf("no rule forbids %s importing %s", from, to)
		}
	}
	if a, _ := pluginOf("plugins/consul/cmd/estuary-plugin-consul"); a != "consul" {
		t.Errorf("pluginOf(consul's cmd) = %q", a)
	}
	if b, _ := pluginOf("plugins/static"); b == "consul" {
		t.Error("static is not consul")
	}
	if _, ok := pluginOf("host/cmd/estuary"); ok {
		t.Error("host/cmd/estuary is not a plugin")
	}
}

// repoImports maps each package (relative to the repository root) to the
// Estuary packages it or its tests import, over every module.
func repoImports(t *testing.T) map[string][]string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list imports: %v", err)
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, m := range modules {
		cmd := exec.Command(goTool, "list", "-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, "./...")
		cmd.Dir = filepath.Join(root, m)
		cmd.Env = append(os.Environ(), "GOWORK=off")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list in %s: %v\n%s", m, err, stderr.String())
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) == 0 {
				continue
			}
			pkg, ok := strings.CutPrefix(fields[0], modulePrefix)
			if !ok {
				t.Fatalf("go list in %s: package %s is outside %s", m, fields[0], modulePrefix)
			}
			var deps []string
			for _, f := range fields[1:] {
				if d, ok := strings.CutPrefix(f, modulePrefix); ok && d != pkg && !slices.Contains(deps, d) {
					deps = append(deps, d)
				}
			}
			out[pkg] = deps
		}
	}
	return out
}

// underAny reports whether pkg is one of the trees (trailing "/") or
// packages in list.
func underAny(pkg string, list []string) bool {
	for _, p := range list {
		if tree, ok := strings.CutSuffix(p, "/"); ok {
			if pkg == tree || strings.HasPrefix(pkg, p) {
				return true
			}
		} else if pkg == p {
			return true
		}
	}
	return false
}

// pluginOf names the bundled plugin a package belongs to.
func pluginOf(pkg string) (string, bool) {
	rest, ok := strings.CutPrefix(pkg, "plugins/")
	if !ok {
		return "", false
	}
	name, _, _ := strings.Cut(rest, "/")
	return name, slices.Contains(pluginNames, name)
}
