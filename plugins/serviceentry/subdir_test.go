package serviceentry

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

// TestSubdirectories: files in subdirectories of dir are read, as Istio's
// file config source reads them, and followed promptly (each subdirectory
// is watched); hidden subdirectories are not read.
func TestSubdirectories(t *testing.T) {
	dir := t.TempDir()
	mkdir := func(p string) string {
		t.Helper()
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	writeFile(t, mkdir("team-a"), "a.yaml", staticEntry("a", "a.example.com", "10.0.0.1"))
	writeFile(t, mkdir(".hidden"), "h.yaml", staticEntry("h", "h.example.com", "10.0.0.9"))
	h := sdktest.Start(t, Factory)
	h.Configure(t, fmt.Sprintf("dir = %q\ncluster_id = \"c1\"\n", dir), mesh)
	w := h.Watch(t)
	w.WaitFor(t, wait, "a.example.com from team-a/", func(r *sdktest.Replica) bool {
		in := instance(r, "c1")
		return in != nil && in.Synced && slices.Equal(addresses(in, "a.example.com"), []string{"10.0.0.1"})
	})
	w.With(func(r *sdktest.Replica) {
		if got := addresses(instance(r, "c1"), "h.example.com"); len(got) > 0 {
			t.Errorf("a hidden subdirectory was read: h.example.com = %v", got)
		}
	})
	// A change deep in a new subdirectory arrives well before the 30 s
	// resync (fileResync): the bound below is shorter.
	writeFile(t, mkdir("team-b/prod"), "b.yaml", staticEntry("b", "b.example.com", "10.0.0.2"))
	w.WaitFor(t, fileResync/2, "b.example.com from team-b/prod/", func(r *sdktest.Replica) bool {
		return slices.Equal(addresses(instance(r, "c1"), "b.example.com"), []string{"10.0.0.2"})
	})
	writeFile(t, filepath.Join(dir, "team-b/prod"), "b.yaml", staticEntry("b", "b.example.com", "10.0.0.3"))
	w.WaitFor(t, fileResync/2, "b.example.com modified in place", func(r *sdktest.Replica) bool {
		return slices.Equal(addresses(instance(r, "c1"), "b.example.com"), []string{"10.0.0.3"})
	})
}
