package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// faultRow is one test the README's Faults table names.
var faultRow = regexp.MustCompile("^\\|.*\\| `([a-z0-9_/]+)` `(Test[A-Za-z0-9_]+)(?:/([^`]+))?` \\|$")

// TestFaultsTable: every row of the README's "Faults" table names a test
// that exists: a Test function in a _test.go file of the package the row
// names, and, for a subtest, a t.Run with that name in the function. The
// table cannot rot when a test is renamed or removed, and the suite keeps
// the 25 scenarios issue 11 asks for.
func TestFaultsTable(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Faults\n")
	if !ok {
		t.Fatal(`README.md has no "## Faults" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := 0
	for line := range strings.SplitSeq(section, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| scenario") || strings.HasPrefix(line, "| ---") {
			continue
		}
		m := faultRow.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("row does not end in `package` `TestName[/subtest]`: %s", line)
			continue
		}
		rows++
		fn := findTest(t, filepath.Join(root, m[1]), m[2])
		if fn == nil {
			t.Errorf("%s: no func %s in %s/*_test.go", line, m[2], m[1])
			continue
		}
		if m[3] != "" && !hasSubtest(fn, m[3]) {
			t.Errorf("%s: %s runs no subtest %q", line, m[2], m[3])
		}
	}
	if rows < 25 {
		t.Errorf("the Faults table lists %d scenarios, want at least 25", rows)
	}
}

// findTest returns the declaration of func name in dir's test files.
func findTest(t *testing.T, dir, name string) *ast.FuncDecl {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Name.Name == name {
				return fn
			}
		}
	}
	return nil
}

// hasSubtest reports whether fn calls Run with the literal name sub (as
// go test prints it: spaces become underscores) or, for a name computed
// from a table, whether fn holds sub as a literal or as a net/http status
// constant.
func hasSubtest(fn *ast.FuncDecl, sub string) bool {
	found := false
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 2 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Run" {
			return true
		}
		switch arg := call.Args[0].(type) {
		case *ast.BasicLit:
			if s, err := strconv.Unquote(arg.Value); err == nil && strings.ReplaceAll(s, " ", "_") == sub {
				found = true
			}
		default:
			// A computed name (a status code from a table): the table's
			// literals are in the function.
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Value == sub {
					found = true
				}
				if sel, ok := n.(*ast.SelectorExpr); ok && statusCodes[sel.Sel.Name] == sub {
					found = true
				}
				return !found
			})
		}
		return !found
	})
	return found
}

// statusCodes are the net/http constants subtests are named by.
var statusCodes = map[string]string{
	"StatusGone": "410", "StatusTooManyRequests": "429", "StatusInternalServerError": "500", "StatusServiceUnavailable": "503",
}
