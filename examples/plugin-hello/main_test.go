package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/estuary-mesh/estuary/sdk"
	"github.com/estuary-mesh/estuary/sdk/sdktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var mesh = sdk.MeshSettings{DomainSuffix: "cluster.local", ClusterID: "Kubernetes"}

// TestConformance runs the SDK's conformance suite, as every plugin must.
func TestConformance(t *testing.T) {
	sdktest.Run(t, sdktest.Suite{
		Factory:  Factory,
		Config:   `greeting = "hello"`,
		Reconfig: `greeting = "bonjour"`,
		Mesh:     mesh,
		Check: func(t testing.TB, r *sdktest.Replica) {
			if len(r.Instances) != 1 {
				t.Errorf("instances: %s", r)
			}
			in := r.Instance("Hello", "Kubernetes")
			if in == nil {
				t.Fatalf("no Hello/Kubernetes instance (cluster defaults to mesh.cluster_id); have %s", r)
			}
			svc := in.Services["hello.example.com"]
			if svc == nil || svc.Labels["greeting"] != "hello" || !slices.Equal(svc.Ports, []sdk.Port{{Name: "http", Number: 80, Protocol: "HTTP"}}) {
				t.Errorf("service = %+v", svc)
			}
			eps := in.Endpoints["hello.example.com"]
			if len(eps) != 1 || eps[0].Address != "127.0.0.1" || eps[0].TargetPorts["http"] != 8080 || eps[0].Labels["app"] != "hello" {
				t.Errorf("endpoints = %+v", eps)
			}
		},
	})
}

// TestReconfigure checks that a new config replaces the running one in
// place, that a renamed cluster moves the instance, and that a bad config
// is refused with a path and keeps the running state.
func TestReconfigure(t *testing.T) {
	h := sdktest.Start(t, Factory)
	h.Configure(t, `greeting = "hello"
cluster = "east"`, mesh)
	w := h.Watch(t)
	greeting := func(cluster string) func(r *sdktest.Replica) bool {
		return func(r *sdktest.Replica) bool {
			in := r.Instance("Hello", cluster)
			return in != nil && in.Synced && in.Services["hello.example.com"] != nil && len(r.Instances) == 1
		}
	}
	w.WaitFor(t, 30*time.Second, "Hello/east", greeting("east"))

	h.Configure(t, `greeting = "hola"
cluster = "east"`, mesh)
	w.WaitFor(t, 30*time.Second, "the new greeting", func(r *sdktest.Replica) bool {
		in := r.Instance("Hello", "east")
		return in != nil && in.Services["hello.example.com"].Labels["greeting"] == "hola"
	})

	h.Configure(t, `greeting = "hola"
cluster = "west"`, mesh)
	w.WaitFor(t, 30*time.Second, "Hello/west only", greeting("west"))

	diags := h.TryConfigure(t, `greeting = ""
cluster = ""`, mesh)
	want := sdk.Diagnostics{
		{Severity: sdk.SeverityError, Summary: "greeting must not be empty", Path: []string{"greeting"}},
		{Severity: sdk.SeverityError, Summary: "cluster must not be empty", Path: []string{"cluster"}},
	}
	if diags.Error() != want.Error() || len(diags) != 2 || diags[0].Severity != sdk.SeverityError {
		t.Errorf("diagnostics:\n got %v\nwant %v", diags, want)
	}
	// A later change proves the refused config left the state alone.
	h.Configure(t, `greeting = "ciao"
cluster = "west"`, mesh)
	w.WaitFor(t, 30*time.Second, "ciao", func(r *sdktest.Replica) bool {
		in := r.Instance("Hello", "west")
		return in != nil && in.Services["hello.example.com"].Labels["greeting"] == "ciao"
	})
	w.With(func(r *sdktest.Replica) {
		if len(r.Instances) != 1 {
			t.Errorf("instances after a refused config: %s", r)
		}
	})
	if err := w.Err(); err != nil {
		t.Errorf("stream: %v", err)
	}
}

// TestDependencies checks the promise a third party relies on: a plugin
// built on the SDK has no client-go, Consul or go-control-plane in its
// module graph, not only in its imports, and nothing of the host or the
// bundled plugins. The one exception is go-control-plane as a requirement of
// grpc's own go.mod (grpc ships an xDS client); no module of Estuary's brings
// it in.
func TestDependencies(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to read the module graph: %v", err)
	}
	cmd := exec.Command(goTool, "mod", "graph")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go mod graph: %v\n%s", err, out)
	}
	forbidden := []string{
		"k8s.io/",
		"sigs.k8s.io/",
		"github.com/hashicorp/consul",
		"github.com/envoyproxy/go-control-plane",
		"github.com/estuary-mesh/estuary@",
		"github.com/estuary-mesh/estuary/host",
		"github.com/estuary-mesh/estuary/plugins",
	}
	sawSDK := false
	for line := range strings.Lines(string(out)) {
		from, to, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if strings.HasPrefix(to, "github.com/estuary-mesh/estuary/sdk@") {
			sawSDK = true
		}
		for _, f := range forbidden {
			if !strings.HasPrefix(to, f) {
				continue
			}
			if f == "github.com/envoyproxy/go-control-plane" && strings.HasPrefix(from, "google.golang.org/grpc@") {
				continue // grpc's own go.mod: see above
			}
			t.Errorf("the module graph holds %s, required by %s", to, from)
		}
	}
	if !sawSDK {
		t.Fatalf("the module graph does not hold the SDK; output:\n%s", out)
	}
}
