package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/estuary-mesh/estuary/testbed"
)

// scratch holds what the tests build once per run (the image and its
// unpacked root filesystem); TestMain removes it.
var scratch string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "estuary-deploy")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	scratch = dir
	code := func() int {
		defer os.RemoveAll(dir)
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(testbed.GoleakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// tools holds the paths of the tools built by deploy/tools/build.sh, once per run.
var tools sync.Map // name -> func() (string, error)

// tool returns the path of a tool pinned in deploy/tools/go.mod (helm, crane),
// building it into the cache the first time (deploy/tools/build.sh).
func tool(t testing.TB, name string) string {
	t.Helper()
	f, _ := tools.LoadOrStore(name, sync.OnceValues(func() (string, error) {
		var stderr bytes.Buffer
		cmd := exec.Command("bash", "tools/build.sh", name)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("deploy/tools/build.sh %s: %w\n%s", name, err, stderr.String())
		}
		if s := stderr.String(); s != "" {
			fmt.Fprint(os.Stderr, s) // the build and its duration, once
		}
		return strings.TrimSpace(string(out)), nil
	}))
	path, err := f.(func() (string, error))()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// run runs a command and returns its stdout, failing the test with its
// stderr if it fails.
func run(t testing.TB, name string, args ...string) []byte {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return out
}
