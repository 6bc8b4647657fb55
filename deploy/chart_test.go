package deploy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/estuary-mesh/estuary/testbed"
)

const chartDir = "helm/estuary"

// helm runs the helm CLI (deploy/tools/go.mod) with its own state directories,
// so nothing of the user's helm setup is read or written.
func helm(t testing.TB, args ...string) ([]byte, error) {
	t.Helper()
	bin := tool(t, "helm")
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config",
		"HELM_DATA_HOME="+home+"/data", "KUBECONFIG="+home+"/no-kubeconfig")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out, nil
}

// chartCase is one set of values the chart is installed with.
type chartCase struct {
	name   string
	values string // a values file, or "" for the defaults
}

// chartCases are the default values and every example values file.
func chartCases(t testing.TB) []chartCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "examples", "*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("examples: %v %v", files, err)
	}
	cases := []chartCase{{name: "default"}}
	for _, f := range files {
		cases = append(cases, chartCase{name: strings.TrimSuffix(filepath.Base(f), ".yaml"), values: f})
	}
	return append(cases, guideValues(t)...)
}

// guideValues are the values files deploy/README.md installs the chart
// with: each YAML block whose first line is "# NAME.yaml" and that sets
// mesh (the east-west gateway's manifest is not a values file), written
// to a file, so the guide's helm install is the chart the tests render.
func guideValues(t testing.TB) []chartCase {
	t.Helper()
	guide, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var cases []chartCase
	for _, block := range strings.Split(string(guide), "```yaml\n")[1:] {
		body, _, _ := strings.Cut(block, "```")
		first, _, _ := strings.Cut(body, "\n")
		name, ok := strings.CutPrefix(first, "# ")
		if !ok || !strings.HasSuffix(name, ".yaml") || !strings.Contains(body, "\nmesh:") {
			continue
		}
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, chartCase{name: "guide-" + strings.TrimSuffix(name, ".yaml"), values: f})
	}
	if len(cases) < 2 {
		t.Fatalf("deploy/README.md: %d values files found, want one per cluster: is the scan broken?", len(cases))
	}
	return cases
}

func (c chartCase) args(extra ...string) []string {
	var a []string
	if c.values != "" {
		a = append(a, "-f", c.values)
	}
	return append(a, extra...)
}

// rendered is what `helm template` made of the chart.
type rendered struct {
	objects []*unstructured.Unstructured
}

// render runs `helm template` for a release in namespace ns.
func render(t testing.TB, c chartCase, release, ns string, extra ...string) *rendered {
	t.Helper()
	out, err := helm(t, append([]string{"template", release, chartDir, "--namespace", ns}, c.args(extra...)...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := &rendered{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("helm template output: %v", err)
		}
		if len(u.Object) == 0 {
			continue
		}
		r.objects = append(r.objects, u)
	}
	return r
}

func (r *rendered) find(kind, name string) *unstructured.Unstructured {
	for _, o := range r.objects {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			return o
		}
	}
	return nil
}

func (r *rendered) all(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.objects {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// as converts a rendered object to its typed form.
func as[T any](t testing.TB, u *unstructured.Unstructured) *T {
	t.Helper()
	v := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, v, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return v
}

// TestChartLint: `helm lint --strict` passes for the default values and
// each example.
func TestChartLint(t *testing.T) {
	for _, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			if _, err := helm(t, append([]string{"lint", "--strict", chartDir}, c.args()...)...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestChartRefusesBadValues: values that cannot work are refused at
// install (helm template: lint turns the chart's fail into a no-op),
// naming the value.
func TestChartRefusesBadValues(t *testing.T) {
	for _, bad := range []struct {
		set  []string
		want string
	}{
		{[]string{"plugins.kubernetes.enabled=false"}, "plugins: enable at least one registry"},
		{[]string{"xds.insecure=true"}, "xds.insecure: plain text is served only with xds.tls.enabled=false"},
		{[]string{"plugins.consul.enabled=true"}, "plugins.consul.address"},
		// values.schema.json: a misspelt key, a value out of its set.
		{[]string{"replicas=3"}, "replicas"},
		{[]string{"mesh.mtls=strict"}, "/mesh/mtls"},
		{[]string{"plugins.kubernetes.remoteSyncTimeout=soon"}, "/plugins/kubernetes/remoteSyncTimeout"},
	} {
		t.Run(strings.Join(bad.set, ","), func(t *testing.T) {
			args := []string{"template", "estuary", chartDir}
			for _, s := range bad.set {
				args = append(args, "--set", s)
			}
			_, err := helm(t, args...)
			if err == nil || !strings.Contains(err.Error(), bad.want) {
				t.Fatalf("helm template with %v: %v; want an error saying %q", bad.set, err, bad.want)
			}
		})
	}
}

// TestChartTemplate renders the chart for the default values and each
// example, checks what the chart promises (read-only RBAC, Secrets only in
// the secret namespace, probes on the admin port, the admin port in no
// Service, a non-root read-only pod), runs `estuary validate`, from the
// image, on the plugins.hcl the pod would read with the files its volumes
// would hold, and applies every object to a real API server with
// server-side apply and strict field validation.
func TestChartTemplate(t *testing.T) {
	img := image(t)
	k := testbed.StartKube(t)
	for i, c := range chartCases(t) {
		t.Run(c.name, func(t *testing.T) {
			ns := fmt.Sprintf("estuary-%d", i)
			r := render(t, c, "estuary", ns)
			checkChart(t, r, ns)
			if cluster, ok := strings.CutPrefix(c.name, "guide-"); ok {
				// The guide names each values file after its cluster.
				cm := as[corev1.ConfigMap](t, r.find("ConfigMap", ""))
				if !strings.Contains(cm.Data["plugins.hcl"], fmt.Sprintf("cluster_id    = %q", cluster)) {
					t.Errorf("the guide's %s.yaml renders a plugins.hcl for another cluster:\n%s", cluster, cm.Data["plugins.hcl"])
				}
			}
			validateMounted(t, img, r)
			applyAll(t, k, r.objects)
		})
	}
}

// writeVerbs are every verb but get, list and watch.
var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection", "impersonate", "bind", "escalate", "approve", "sign", "*"}

func checkChart(t *testing.T, r *rendered, ns string) {
	t.Helper()
	cm := r.find("ConfigMap", "")
	if cm == nil {
		t.Fatal("no ConfigMap")
	}
	hcl, _, _ := unstructured.NestedString(cm.Object, "data", "plugins.hcl")
	enabled := func(plugin string) bool { return strings.Contains(hcl, fmt.Sprintf("plugin %q {", plugin)) }

	// RBAC: read-only; Secrets through a Role in the secret namespace only.
	for _, cr := range r.all("ClusterRole") {
		role := as[rbacv1.ClusterRole](t, cr)
		for _, rule := range role.Rules {
			checkReadOnly(t, "ClusterRole "+role.Name, rule)
			if slices.Contains(rule.Resources, "secrets") || slices.Contains(rule.Resources, "*") {
				t.Errorf("ClusterRole %s grants %v cluster-wide", role.Name, rule.Resources)
			}
			if len(rule.NonResourceURLs) > 0 {
				t.Errorf("ClusterRole %s grants %v", role.Name, rule.NonResourceURLs)
			}
		}
		if got := slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "serviceentries") }); got != enabled("serviceentry") {
			t.Errorf("ClusterRole grants ServiceEntries: %v, serviceentry plugin enabled: %v", got, enabled("serviceentry"))
		}
		mcs := strings.Contains(hcl, "mcs = true")
		if got := slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "serviceexports") }); got != mcs {
			t.Errorf("ClusterRole grants ServiceExports: %v, kubernetes plugin with mcs: %v", got, mcs)
		}
	}
	roles := r.all("Role")
	if enabled("kubernetes") != (len(roles) == 1) {
		t.Errorf("%d Roles with the kubernetes plugin enabled: %v; want one, for its Secrets", len(roles), enabled("kubernetes"))
	}
	for _, ro := range roles {
		role := as[rbacv1.Role](t, ro)
		for _, rule := range role.Rules {
			checkReadOnly(t, "Role "+role.Name, rule)
			if !slices.Equal(rule.Resources, []string{"secrets"}) || !slices.Equal(rule.APIGroups, []string{""}) {
				t.Errorf("Role %s grants %v %v, want Secrets only", role.Name, rule.APIGroups, rule.Resources)
			}
		}
		if want := fmt.Sprintf("secret_namespace    = %q", role.Namespace); !strings.Contains(hcl, want) {
			t.Errorf("Role for Secrets is in namespace %s, but plugins.hcl does not say %s:\n%s", role.Namespace, want, hcl)
		}
	}
	if !enabled("kubernetes") && !enabled("serviceentry") && len(r.all("ClusterRole")) > 0 {
		t.Error("a ClusterRole without any plugin that reads the API server")
	}

	// The Deployment: replicas, anti-affinity, probes, a non-root pod.
	d := as[appsv1.Deployment](t, r.find("Deployment", ""))
	pod := d.Spec.Template.Spec
	if *d.Spec.Replicas > 1 {
		pdb := r.find("PodDisruptionBudget", "")
		if pdb == nil {
			t.Errorf("%d replicas and no PodDisruptionBudget", *d.Spec.Replicas)
		}
	}
	if a := pod.Affinity; a == nil || a.PodAntiAffinity == nil {
		t.Error("no pod anti-affinity")
	}
	sc := pod.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("pod security context %+v: want runAsNonRoot and a non-zero user", sc)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	ctr := pod.Containers[0]
	if csc := ctr.SecurityContext; csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem ||
		csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation || csc.Capabilities == nil || !slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container security context %+v: want a read-only root, no privilege escalation, no capabilities", csc)
	}
	if ctr.Resources.Requests.Memory().IsZero() || ctr.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want memory requests and limits", ctr.Resources)
	}
	var adminPort int32
	for _, p := range ctr.Ports {
		if p.Name == "http-admin" {
			adminPort = p.ContainerPort
		}
	}
	if adminPort != 15014 {
		t.Errorf("container ports %+v: want http-admin on 15014", ctr.Ports)
	}
	for probe, want := range map[*corev1.Probe]string{ctr.LivenessProbe: "/healthz", ctr.ReadinessProbe: "/readyz"} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != want || probe.HTTPGet.Port.String() != "http-admin" {
			t.Errorf("probe %+v: want GET %s on http-admin", probe, want)
		}
	}

	// The xDS Service: the xDS port, never the admin port.
	svcs := r.all("Service")
	xdsTLS := strings.Contains(hcl, "tls {")
	loopbackOnly := strings.Contains(hcl, `listen             = "127.0.0.1:15010"`)
	if loopbackOnly != (len(svcs) == 0) {
		t.Errorf("xDS on loopback only: %v, but %d Services", loopbackOnly, len(svcs))
	}
	for _, s := range svcs {
		svc := as[corev1.Service](t, s)
		for _, p := range svc.Spec.Ports {
			if p.Port == 15014 || p.TargetPort.String() == "http-admin" {
				t.Errorf("Service %s exposes the admin port", svc.Name)
			}
			if want := int32(15010); xdsTLS {
				want = 15012
				if p.Port != want {
					t.Errorf("Service port %d, want %d with TLS", p.Port, want)
				}
			} else if p.Port != want || !strings.Contains(hcl, "insecure           = true") {
				t.Errorf("plain-text Service port %d without insecure = true", p.Port)
			}
		}
	}

	// A chart-made xDS certificate is valid for the Service's names.
	if s := r.find("Secret", "estuary-xds-tls"); s != nil {
		sec := as[corev1.Secret](t, s)
		checkServingCert(t, sec.Data["tls.crt"], sec.Data["ca.crt"], "estuary."+ns+".svc")
	}
}

func checkReadOnly(t *testing.T, who string, rule rbacv1.PolicyRule) {
	t.Helper()
	for _, v := range rule.Verbs {
		if slices.Contains(writeVerbs, v) {
			t.Errorf("%s grants %s on %v", who, v, rule.Resources)
		}
	}
}

func checkServingCert(t *testing.T, certPEM, caPEM []byte, name string) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no certificate")
	}
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatal("tls.crt holds no PEM block")
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("xDS certificate for %s: %v", name, err)
	}
}

// validateMounted writes into the image's files what the pod's volumes
// would mount (the rendered ConfigMap and Secrets; Secrets the operator
// provides are made up here) and runs `estuary validate` from the image on
// the config the container's arguments name.
func validateMounted(t *testing.T, img *ociImage, r *rendered) {
	t.Helper()
	d := as[appsv1.Deployment](t, r.find("Deployment", ""))
	ctr := d.Spec.Template.Spec.Containers[0]
	if len(ctr.Args) < 3 || ctr.Args[0] != "run" || ctr.Args[1] != "-config" {
		t.Fatalf("container args %q, want run -config FILE ...", ctr.Args)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range ctr.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			t.Fatalf("volume mount %s names no volume", m.Name)
		}
		var files map[string][]byte
		var items []corev1.KeyToPath
		switch {
		case v.ConfigMap != nil:
			cm := r.find("ConfigMap", v.ConfigMap.Name)
			if cm == nil {
				t.Fatalf("volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name)
			}
			files = map[string][]byte{}
			for k, s := range as[corev1.ConfigMap](t, cm).Data {
				files[k] = []byte(s)
			}
			items = v.ConfigMap.Items
		case v.Secret != nil:
			if s := r.find("Secret", v.Secret.SecretName); s != nil {
				files = as[corev1.Secret](t, s).Data
			} else {
				files = operatorSecret(t, v.Name)
			}
			items = v.Secret.Items
		default:
			continue
		}
		for _, it := range items {
			if _, ok := files[it.Key]; !ok {
				t.Fatalf("volume %s: no key %s", v.Name, it.Key)
			}
		}
		for k, b := range files {
			if len(items) > 0 {
				i := slices.IndexFunc(items, func(it corev1.KeyToPath) bool { return it.Key == k })
				if i < 0 {
					continue
				}
				k = items[i].Path
			}
			img.writeFile(t, path.Join(m.MountPath, k), b)
		}
	}
	cfg := ctr.Args[2]
	if os.Geteuid() != 0 {
		// Not chrooted: the paths in the file must lead into the image too.
		p := filepath.Join(img.rootfs, cfg)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.ReplaceAll(b, []byte(`"/etc/estuary/`), []byte(`"`+img.rootfs+`/etc/estuary/`)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img.exec(t, "validate", "-config", cfg)
}

// operatorSecret makes up the Secret an operator names in the values.
func operatorSecret(t *testing.T, volume string) map[string][]byte {
	t.Helper()
	switch volume {
	case "xds-tls":
		cert, key, ca := selfSigned(t, "estuary.estuary-system.svc")
		return map[string][]byte{"tls.crt": cert, "tls.key": key, "ca.crt": ca}
	default:
		return map[string][]byte{"token": []byte("an-operator-token")}
	}
}

// selfSigned makes a self-signed serving certificate; it is its own CA.
func selfSigned(t *testing.T, name string) (cert, key, ca []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return cert, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), cert
}

// applyAll applies objects to the API server with server-side apply and
// strict field validation, so the server checks every field of every
// object: CRDs first, the namespaces the objects are in created first.
func applyAll(t testing.TB, k *testbed.Kube, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := k.Client()
	for _, o := range objs {
		if ns := o.GetNamespace(); ns != "" {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
			if err != nil && !strings.Contains(err.Error(), "already exists") {
				t.Fatal(err)
			}
		}
	}
	dyn, err := dynamic.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cs.Discovery()))
	ordered := slices.Clone(objs)
	slices.SortStableFunc(ordered, func(a, b *unstructured.Unstructured) int {
		return boolInt(b.GetKind() == "CustomResourceDefinition") - boolInt(a.GetKind() == "CustomResourceDefinition")
	})
	force := true
	for _, o := range ordered {
		gvk := o.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		for meta.IsNoMatchError(err) && ctx.Err() == nil { // a CRD applied just now
			time.Sleep(100 * time.Millisecond)
			mapper.Reset()
			mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		}
		if err != nil {
			t.Fatalf("%s %s: %v", gvk, o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
		}
		data, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			FieldManager: "estuary-chart-test", Force: &force, FieldValidation: "Strict",
		}); err != nil {
			t.Errorf("apply %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestChartCRDsAreIstios: the CRDs the chart installs are Istio's, as the
// istio.io/api module the project builds against ships them, so a bump of
// istio.io/api fails here until files/crds is copied again.
func TestChartCRDsAreIstios(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/api").Output()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "kubernetes", "customresourcedefinitions.gen.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	istio := map[string]map[string]any{}
	for _, doc := range bytes.Split(src, []byte("\n---\n")) {
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil || m == nil {
			continue
		}
		name, _, _ := unstructured.NestedString(m, "metadata", "name")
		istio[name] = m
	}
	for _, name := range []string{"serviceentries.networking.istio.io", "workloadentries.networking.istio.io"} {
		b, err := os.ReadFile(filepath.Join(chartDir, "files", "crds", name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var ours map[string]any
		if err := yaml.Unmarshal(b, &ours); err != nil {
			t.Fatal(err)
		}
		if istio[name] == nil || !equalJSON(ours, istio[name]) {
			t.Errorf("%s/files/crds/%s.yaml differs from istio.io/api's kubernetes/customresourcedefinitions.gen.yaml: copy its document again", chartDir, name)
		}
	}
	// And the chart renders them only when asked.
	c := chartCase{name: "default"}
	if r := render(t, c, "estuary", "estuary-system"); r.find("CustomResourceDefinition", "") != nil {
		t.Error("CRDs rendered with crds.install=false")
	}
	r := render(t, c, "estuary", "estuary-system", "--set", "crds.install=true")
	if n := len(r.all("CustomResourceDefinition")); n != 2 {
		t.Errorf("%d CRDs rendered with crds.install=true, want 2", n)
	}
}

func equalJSON(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// tokenClient returns a clientset for an identity: the API
// server's address and CA with a bearer token.
func tokenClient(t testing.TB, k *testbed.Kube, token string) kubernetes.Interface {
	t.Helper()
	cfg := k.RestConfig()
	cfg.BearerToken, cfg.BearerTokenFile = token, ""
	cfg.CertData, cfg.KeyData, cfg.CertFile, cfg.KeyFile = nil, nil, "", ""
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
