package testbed

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	mcscrd "sigs.k8s.io/mcs-api/config/crd"
	"sigs.k8s.io/yaml"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallIstioCRDs installs the named CRDs (such as
// "serviceentries.networking.istio.io") as the istio.io/api module the
// project requires ships them, and waits until they are established.
func (k *Kube) InstallIstioCRDs(t testing.TB, names ...string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/api").Output()
	if err != nil {
		t.Fatalf("testbed: locate istio.io/api: %v", err)
	}
	path := filepath.Join(strings.TrimSpace(string(out)), "kubernetes", "customresourcedefinitions.gen.yaml")
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	k.installCRDs(t, path, bytes.Split(src, []byte("\n---\n")), names)
}

// MCS CRD names, as sigs.k8s.io/mcs-api defines them.
const (
	CRDServiceExports = "serviceexports.multicluster.x-k8s.io"
	CRDServiceImports = "serviceimports.multicluster.x-k8s.io"
)

// InstallMCSCRDs installs the Kubernetes Multi-Cluster Services API CRDs,
// ServiceExport and ServiceImport, exactly as the sigs.k8s.io/mcs-api
// module the project requires ships them (its config/crd package embeds
// the upstream YAML), and waits until they are established. They serve
// v1alpha1 and v1beta1.
func (k *Kube) InstallMCSCRDs(t testing.TB) {
	t.Helper()
	k.installCRDs(t, "sigs.k8s.io/mcs-api/config/crd", [][]byte{mcscrd.ServiceExportCRD, mcscrd.ServiceImportCRD},
		[]string{CRDServiceExports, CRDServiceImports})
}

// installCRDs creates the CRDs among docs (YAML documents from source)
// whose names are listed, and waits until they are established.
func (k *Kube) installCRDs(t testing.TB, source string, docs [][]byte, names []string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var installed []string
	for _, doc := range docs {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil || u.Object == nil {
			continue
		}
		if u.GetKind() != "CustomResourceDefinition" || !slices.Contains(names, u.GetName()) {
			continue
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("testbed: create CRD %s: %v", u.GetName(), err)
		}
		installed = append(installed, u.GetName())
	}
	if len(installed) != len(names) {
		t.Fatalf("testbed: found CRDs %v in %s, want %v", installed, source, names)
	}
	for _, name := range installed {
		for {
			u, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err == nil && crdEstablished(u) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("testbed: CRD %s not established: %v", name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func crdEstablished(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
