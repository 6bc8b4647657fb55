package serviceentry

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
	"github.com/estuary-mesh/estuary/testbed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testbed.GoleakOptions()...) }

const wait = 30 * time.Second

var mesh = sdk.MeshSettings{DomainSuffix: "cluster.local", ClusterID: "mesh-cluster", Network: "net1"}

// staticEntry is a STATIC ServiceEntry for host with one endpoint per IP.
func staticEntry(name, host string, ips ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: %s
  namespace: default
spec:
  hosts: [%s]
  location: MESH_INTERNAL
  ports:
  - {number: 80, name: http, protocol: HTTP}
  resolution: STATIC
  endpoints:
`, name, host)
	for _, ip := range ips {
		fmt.Fprintf(&b, "  - address: %s\n", ip)
	}
	return b.String()
}

func writeFile(t testing.TB, dir, name, content string) {
	t.Helper()
	// Write then rename, as editors and ConfigMap updates do, so the watch
	// never reads half a file.
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// addresses returns the endpoint addresses of host in the instance.
func addresses(in *sdktest.Instance, host string) []string {
	if in == nil {
		return nil
	}
	var out []string
	for _, e := range in.Endpoints[host] {
		out = append(out, e.Address)
	}
	slices.Sort(out)
	return out
}

func hasNotice(in *sdktest.Instance, subject, message string) bool {
	if in == nil || in.Health == nil {
		return false
	}
	return slices.ContainsFunc(in.Health.Notices, func(n sdk.Notice) bool {
		return strings.Contains(n.Subject, subject) && strings.Contains(n.Message, message)
	})
}

func instance(r *sdktest.Replica, cluster string) *sdktest.Instance {
	return r.Instance(sdk.ProviderServiceEntry, cluster)
}

func TestConformance(t *testing.T) {
	dir, dir2 := t.TempDir(), t.TempDir()
	writeFile(t, dir, "a.yaml", staticEntry("a", "a.example.com", "10.0.0.1", "10.0.0.2"))
	writeFile(t, dir2, "a.yaml", staticEntry("a", "a.example.com", "10.0.0.3"))
	sdktest.Run(t, sdktest.Suite{
		Factory:  Factory,
		Mesh:     mesh,
		Config:   fmt.Sprintf("dir = %q\n", dir),
		Reconfig: fmt.Sprintf("dir = %q\nnetwork = \"net2\"\n", dir2),
		Check: func(t testing.TB, r *sdktest.Replica) {
			if len(r.Instances) != 1 {
				t.Errorf("instances = %v, want only ServiceEntry/mesh-cluster", r)
			}
			in := instance(r, "mesh-cluster") // cluster_id defaults to the mesh's
			if in == nil {
				t.Fatalf("no ServiceEntry/mesh-cluster instance; have %s", r)
			}
			if in.Properties.ClusterScoped || in.Properties.DefaultNetwork != "net1" {
				t.Errorf("properties = %+v, want not cluster scoped, default network net1", in.Properties)
			}
			if got := addresses(in, "a.example.com"); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2"}) {
				t.Errorf("endpoints of a.example.com = %v", got)
			}
			if in.Health == nil || !in.Health.Healthy || len(in.Health.Notices) != 0 {
				t.Errorf("health = %+v, want healthy without notices", in.Health)
			}
		},
		Change: func(t testing.TB) { writeFile(t, dir, "b.yaml", staticEntry("b", "b.example.com", "10.0.1.1")) },
		Changed: func(r *sdktest.Replica) bool {
			return len(addresses(instance(r, "mesh-cluster"), "b.example.com")) == 1
		},
	})
}

// TestDirectoryWatch writes, modifies, renames and deletes files and checks
// that the instance follows each step.
func TestDirectoryWatch(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", staticEntry("a", "a.example.com", "10.0.0.1"))
	h := sdktest.Start(t, Factory)
	h.Configure(t, fmt.Sprintf("dir = %q\ncluster_id = \"c1\"\n", dir), mesh)
	w := h.Watch(t)
	w.WaitFor(t, wait, "a.example.com served", func(r *sdktest.Replica) bool {
		in := instance(r, "c1")
		return in != nil && in.Synced && slices.Equal(addresses(in, "a.example.com"), []string{"10.0.0.1"})
	})

	steps := []struct {
		name   string
		do     func()
		follow func(in *sdktest.Instance) bool
	}{
		{"modify a file", func() { writeFile(t, dir, "a.yaml", staticEntry("a", "a.example.com", "10.0.0.1", "10.0.0.2")) },
			func(in *sdktest.Instance) bool {
				return slices.Equal(addresses(in, "a.example.com"), []string{"10.0.0.1", "10.0.0.2"})
			}},
		{"modify in place", func() {
			if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(staticEntry("a", "a.example.com", "10.0.0.9")), 0o644); err != nil {
				t.Fatal(err)
			}
		}, func(in *sdktest.Instance) bool {
			return slices.Equal(addresses(in, "a.example.com"), []string{"10.0.0.9"})
		}},
		{"add a file with a selector and workloads", func() {
			writeFile(t, dir, "b.yaml", `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: b, namespace: default}
spec:
  hosts: [b.example.com]
  location: MESH_INTERNAL
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: b}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: b1, namespace: default}
spec: {address: 10.1.0.1, labels: {app: b}}
`)
		}, func(in *sdktest.Instance) bool {
			return slices.Equal(addresses(in, "b.example.com"), []string{"10.1.0.1"})
		}},
		{"a workload in another file joins", func() {
			writeFile(t, dir, "c.yml", `apiVersion: networking.istio.io/v1beta1
kind: WorkloadEntry
metadata: {name: b2, namespace: default}
spec: {address: 10.1.0.2, labels: {app: b}}
`)
		}, func(in *sdktest.Instance) bool {
			return slices.Equal(addresses(in, "b.example.com"), []string{"10.1.0.1", "10.1.0.2"})
		}},
		{"files that are not YAML are ignored", func() {
			writeFile(t, dir, "notes.txt", "not: [yaml")
			writeFile(t, dir, "d.yaml", staticEntry("d", "d.example.com", "10.3.0.1"))
		}, func(in *sdktest.Instance) bool {
			return len(addresses(in, "d.example.com")) == 1 && len(in.Health.Notices) == 0
		}},
		{"rename a file", func() {
			if err := os.Rename(filepath.Join(dir, "c.yml"), filepath.Join(dir, "e.yaml")); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(dir, "d.yaml"), filepath.Join(dir, "d.yaml.bak")); err != nil {
				t.Fatal(err)
			}
		}, func(in *sdktest.Instance) bool {
			_, d := in.Services["d.example.com"]
			return !d && slices.Equal(addresses(in, "b.example.com"), []string{"10.1.0.1", "10.1.0.2"})
		}},
		{"delete a file", func() {
			if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
				t.Fatal(err)
			}
		}, func(in *sdktest.Instance) bool {
			_, a := in.Services["a.example.com"]
			return !a && len(addresses(in, "b.example.com")) == 2
		}},
		{"delete the workloads' file", func() {
			if err := os.Remove(filepath.Join(dir, "e.yaml")); err != nil {
				t.Fatal(err)
			}
		}, func(in *sdktest.Instance) bool {
			return slices.Equal(addresses(in, "b.example.com"), []string{"10.1.0.1"})
		}},
	}
	for _, s := range steps {
		s.do()
		w.WaitFor(t, wait, s.name, func(r *sdktest.Replica) bool {
			in := instance(r, "c1")
			return in != nil && s.follow(in)
		})
	}
}

// TestConfigMapVolume swaps the directory behind symlinks the way the
// kubelet updates a ConfigMap volume: the file names never change.
func TestConfigMapVolume(t *testing.T) {
	dir := t.TempDir()
	publish := func(version, content string) {
		data := filepath.Join(dir, "..data_"+version)
		if err := os.Mkdir(data, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(data, "se.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(data), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	publish("1", staticEntry("a", "a.example.com", "10.0.0.1"))
	if err := os.Symlink("..data/se.yaml", filepath.Join(dir, "se.yaml")); err != nil {
		t.Fatal(err)
	}
	h := sdktest.Start(t, Factory)
	h.Configure(t, fmt.Sprintf("dir = %q\ncluster_id = \"c1\"\n", dir), mesh)
	w := h.Watch(t)
	w.WaitFor(t, wait, "first version", func(r *sdktest.Replica) bool {
		return slices.Equal(addresses(instance(r, "c1"), "a.example.com"), []string{"10.0.0.1"})
	})
	publish("2", staticEntry("a", "a.example.com", "10.0.0.2"))
	w.WaitFor(t, wait, "second version", func(r *sdktest.Replica) bool {
		return slices.Equal(addresses(instance(r, "c1"), "a.example.com"), []string{"10.0.0.2"})
	})
}

// TestInvalidFile checks that a bad document is reported with its position
// while everything else keeps serving, and that a file that turns invalid
// keeps its last good objects until it is fixed.
func TestInvalidFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "good.yaml", staticEntry("x", "x.example.com", "10.0.0.1"))
	writeFile(t, dir, "mixed.yaml", staticEntry("m1", "m1.example.com", "10.1.0.1")+
		"---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: m2\n"+
		"---\n"+staticEntry("m3", "m3.example.com", "10.1.0.3"))
	h := sdktest.Start(t, Factory)
	h.Configure(t, fmt.Sprintf("dir = %q\ncluster_id = \"c1\"\n", dir), mesh)
	w := h.Watch(t)
	mixed := filepath.Join(dir, "mixed.yaml")
	w.WaitFor(t, wait, "the rest of the file served, the bad document reported", func(r *sdktest.Replica) bool {
		in := instance(r, "c1")
		return in != nil && in.Synced && in.Health.Healthy &&
			len(addresses(in, "m1.example.com")) == 1 && len(addresses(in, "m3.example.com")) == 1 &&
			len(addresses(in, "x.example.com")) == 1 &&
			hasNotice(in, mixed+":15, document 2", "malformed YAML: yaml: line 17: did not find expected")
	})

	// An object turns invalid: its last good version stays.
	writeFile(t, dir, "good.yaml", strings.Replace(staticEntry("x", "x.example.com", "10.0.0.2"), "number: 80, ", "", 1))
	good := filepath.Join(dir, "good.yaml")
	w.WaitFor(t, wait, "the last good version kept and the error reported", func(r *sdktest.Replica) bool {
		in := instance(r, "c1")
		return slices.Equal(addresses(in, "x.example.com"), []string{"10.0.0.1"}) &&
			hasNotice(in, "ServiceEntry default/x ("+good+":1, document 1)", "spec.ports[0].number: port without number; serving its last good version")
	})

	// The whole file turns into garbage: still served.
	writeFile(t, dir, "good.yaml", "apiVersion: [\n")
	w.WaitFor(t, wait, "the last good version kept through a malformed file", func(r *sdktest.Replica) bool {
		in := instance(r, "c1")
		return slices.Equal(addresses(in, "x.example.com"), []string{"10.0.0.1"}) &&
			hasNotice(in, good+":1, document 1", "1 more objects of the file's last good version are kept")
	})

	// Fixed: the new version is served and the notices go.
	writeFile(t, dir, "good.yaml", staticEntry("x", "x.example.com", "10.0.0.3"))
	writeFile(t, dir, "mixed.yaml", staticEntry("m1", "m1.example.com", "10.1.0.1"))
	w.WaitFor(t, wait, "the fixed files", func(r *sdktest.Replica) bool {
		in := instance(r, "c1")
		_, m3 := in.Services["m3.example.com"]
		return slices.Equal(addresses(in, "x.example.com"), []string{"10.0.0.3"}) && !m3 && len(in.Health.Notices) == 0
	})

	// The same object in two files: the first file (by name) wins.
	writeFile(t, dir, "zz.yaml", staticEntry("x", "x.example.com", "10.9.9.9"))
	w.WaitFor(t, wait, "a duplicate object reported", func(r *sdktest.Replica) bool {
		in := instance(r, "c1")
		return slices.Equal(addresses(in, "x.example.com"), []string{"10.0.0.3"}) &&
			hasNotice(in, filepath.Join(dir, "zz.yaml"), "also defined at "+good)
	})
}

// TestDirectoryRemoved: a directory that disappears makes the instance
// unhealthy but keeps its state; recreated, it is read again.
func TestDirectoryRemoved(t *testing.T) {
	saved := fileResync
	fileResync = 100 * time.Millisecond
	t.Cleanup(func() { fileResync = saved })

	root := t.TempDir()
	dir := filepath.Join(root, "se")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "a.yaml", staticEntry("a", "a.example.com", "10.0.0.1"))
	h := sdktest.Start(t, Factory)
	h.Configure(t, fmt.Sprintf("dir = %q\ncluster_id = \"c1\"\n", dir), mesh)
	w := h.Watch(t)
	w.WaitFor(t, wait, "served", func(r *sdktest.Replica) bool { return len(addresses(instance(r, "c1"), "a.example.com")) == 1 })

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	w.WaitFor(t, wait, "unhealthy, state kept", func(r *sdktest.Replica) bool {
		in := instance(r, "c1")
		return !in.Health.Healthy && strings.Contains(in.Health.Message, dir) && len(addresses(in, "a.example.com")) == 1
	})

	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "b.yaml", staticEntry("b", "b.example.com", "10.0.0.2"))
	w.WaitFor(t, wait, "healthy again, reading the new directory", func(r *sdktest.Replica) bool {
		in := instance(r, "c1")
		_, a := in.Services["a.example.com"]
		return in.Health.Healthy && !a && len(addresses(in, "b.example.com")) == 1
	})
	// The watch is back: a change is seen without waiting for a rescan.
	writeFile(t, dir, "b.yaml", staticEntry("b", "b.example.com", "10.0.0.3"))
	w.WaitFor(t, wait, "change after recreation", func(r *sdktest.Replica) bool {
		return slices.Equal(addresses(instance(r, "c1"), "b.example.com"), []string{"10.0.0.3"})
	})
}

func TestConfigureDiagnostics(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f.yaml")
	writeFile(t, dir, "f.yaml", "")
	tests := []struct {
		name, config string
		mesh         sdk.MeshSettings
		wantPath     []string
		wantMsg      string
	}{
		{"nothing to watch", ``, mesh, nil, "nothing to watch"},
		{"missing dir", `dir = "/does/not/exist"`, mesh, []string{"dir"}, "no such file or directory"},
		{"dir is a file", fmt.Sprintf("dir = %q", file), mesh, []string{"dir"}, "is not a directory"},
		{"no cluster", fmt.Sprintf("dir = %q", dir), sdk.MeshSettings{}, []string{"cluster_id"}, "must not be empty"},
		{"bad default namespace", fmt.Sprintf("dir = %q\ndefault_namespace = \"Not_OK\"", dir), mesh, []string{"default_namespace"}, "not a namespace name"},
		{"bad kubeconfig", "kubernetes {\n  kubeconfig = \"/does/not/exist\"\n}", mesh, []string{"kubernetes", "0", "kubeconfig"}, "/does/not/exist"},
		{"bad namespace", fmt.Sprintf("kubernetes {\n  kubeconfig = %q\n  namespaces = [\"ok\", \"Not_OK\"]\n}", writeKubeconfig(t)), mesh,
			[]string{"kubernetes", "0", "namespaces"}, `namespaces[1]: "Not_OK"`},
	}
	h := sdktest.Start(t, Factory)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			diags := h.TryConfigure(t, tt.config, tt.mesh)
			if !slices.ContainsFunc(diags, func(d sdk.Diagnostic) bool {
				return d.Severity == sdk.SeverityError && slices.Equal(d.Path, tt.wantPath) && strings.Contains(d.Summary, tt.wantMsg)
			}) {
				t.Errorf("diagnostics %+v lack %q at %v", diags, tt.wantMsg, tt.wantPath)
			}
		})
	}
}

// writeKubeconfig writes a syntactically valid kubeconfig for a server that
// is never contacted.
func writeKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestReconfigure moves the instance to another cluster ID and another
// directory, and checks that a rejected config keeps the running one.
func TestReconfigure(t *testing.T) {
	dir1, dir2 := t.TempDir(), t.TempDir()
	writeFile(t, dir1, "a.yaml", staticEntry("a", "a.example.com", "10.0.0.1"))
	writeFile(t, dir2, "b.yaml", staticEntry("b", "b.example.com", "10.0.0.2"))
	h := sdktest.Start(t, Factory)
	h.Configure(t, fmt.Sprintf("dir = %q\ncluster_id = \"c1\"\n", dir1), mesh)
	w := h.Watch(t)
	w.WaitFor(t, wait, "c1 serves a", func(r *sdktest.Replica) bool { return len(addresses(instance(r, "c1"), "a.example.com")) == 1 })

	if diags := h.TryConfigure(t, `dir = "/does/not/exist"`, mesh); !diags.HasErrors() {
		t.Fatalf("a missing directory was accepted")
	}
	writeFile(t, dir1, "a.yaml", staticEntry("a", "a.example.com", "10.0.0.1", "10.0.0.5"))
	w.WaitFor(t, wait, "the old config still running", func(r *sdktest.Replica) bool {
		return len(addresses(instance(r, "c1"), "a.example.com")) == 2
	})

	h.Configure(t, fmt.Sprintf("dir = %q\ncluster_id = \"c2\"\nnetwork = \"n2\"\n", dir2), mesh)
	w.WaitFor(t, wait, "the instance moved to c2", func(r *sdktest.Replica) bool {
		in := instance(r, "c2")
		return instance(r, "c1") == nil && in != nil && in.Synced && in.Properties.DefaultNetwork == "n2" &&
			len(in.Services) == 1 && len(addresses(in, "b.example.com")) == 1
	})
}
