package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclwrite"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/testbed"
)

// The guide's marks, in an HTML comment on the line before a command
// block: <!-- guide: run by TestX -->, <!-- guide: chart: why -->,
// <!-- guide: not testable here: why -->.
const (
	guideMarker     = "<!-- guide:"
	markRunBy       = "run by "
	markChart       = "chart:"
	markNotTestable = "not testable here:"
	walkthrough     = "TestDeployGuideWalkthrough"
	guidePath       = "deploy/README.md"
	guideAdminToken = "guide-admin-token"
)

// guideBlock is one fenced block of the deployment guide.
type guideBlock struct {
	lang string
	line int    // of the fence
	mark string // the guide mark before it, without the comment syntax
	text string
	file string // for YAML: the file name its first line "# NAME" gives
}

func (b guideBlock) pos() string { return fmt.Sprintf("%s:%d", guidePath, b.line) }

func readGuide(t *testing.T) []guideBlock {
	t.Helper()
	blocks, err := fencedBlocks(filepath.Join(repoRoot, guidePath), guidePath)
	if err != nil {
		t.Fatal(err)
	}
	var out []guideBlock
	for _, f := range blocks {
		b := guideBlock{lang: f.lang, line: f.line, text: f.text}
		if m, ok := strings.CutPrefix(f.previous, guideMarker); ok {
			b.mark = strings.TrimSpace(strings.TrimSuffix(m, "-->"))
		}
		if name, ok := strings.CutPrefix(strings.SplitN(f.text, "\n", 2)[0], "# "); ok && f.lang == "yaml" {
			b.file = strings.TrimSpace(name)
		}
		out = append(out, b)
	}
	return out
}

// commands returns a shell block's commands, each a pipeline of word
// lists; comments and a trailing "&" are dropped.
func (b guideBlock) commands() ([][][]string, error) {
	var out [][][]string
	for _, line := range strings.Split(strings.ReplaceAll(b.text, "\\\n", " "), "\n") {
		words, err := shellWords(line)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", b.pos(), line, err)
		}
		if len(words) == 0 {
			continue
		}
		var pipeline [][]string
		var cur []string
		for _, w := range words {
			switch w {
			case "|", "&&":
				pipeline = append(pipeline, cur)
				cur = nil
			case "&":
			default:
				cur = append(cur, w)
			}
		}
		out = append(out, append(pipeline, cur))
	}
	return out, nil
}

// shellWords splits a line as sh would for the simple commands the guide
// uses: words, '...' and "..." quoting, "#" comments, and |, && and &
// as words of their own. A line it does not understand ($, backticks) is
// an error, so the guide stays within what the tests can read.
func shellWords(line string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		inTok bool
	)
	flush := func() {
		if inTok {
			words = append(words, cur.String())
			cur.Reset()
			inTok = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			flush()
		case c == '#' && !inTok:
			flush()
			return words, nil
		case c == '\'' || c == '"':
			end := strings.IndexByte(line[i+1:], c)
			if end < 0 {
				return nil, errors.New("unclosed quote")
			}
			cur.WriteString(line[i+1 : i+1+end])
			inTok = true
			i += end + 1
		case c == '|' || c == '&':
			flush()
			if c == '&' && i+1 < len(line) && line[i+1] == '&' {
				words = append(words, "&&")
				i++
			} else {
				words = append(words, string(c))
			}
		case c == '$' || c == '`' || c == '\\' || c == ';':
			return nil, fmt.Errorf("%q is beyond what the guide test reads", c)
		default:
			cur.WriteByte(c)
			inTok = true
		}
	}
	flush()
	return words, nil
}

// TestDeployGuide: every command block of deploy/README.md carries a mark
// saying how it is checked, naming tests that exist; every estuary
// command in it names a real command whose flags the real binary accepts;
// every YAML block parses, and every Kubernetes object in one decodes
// strictly (an unknown field is an error).
func TestDeployGuide(t *testing.T) {
	blocks := readGuide(t)
	var estuaryCmds, yamlDocs, shBlocks int
	for _, b := range blocks {
		switch b.lang {
		case "sh":
			shBlocks++
			switch {
			case strings.HasPrefix(b.mark, markRunBy):
				for name := range strings.SplitSeq(strings.TrimPrefix(b.mark, markRunBy), ",") {
					if name = strings.TrimSpace(name); findTest(t, ".", name) == nil {
						t.Errorf("%s: run by %s, which does not exist", b.pos(), name)
					}
				}
			case strings.HasPrefix(b.mark, markChart), strings.HasPrefix(b.mark, markNotTestable):
				if len(strings.TrimSpace(b.mark[strings.Index(b.mark, ":")+1:])) < 10 {
					t.Errorf("%s: %q needs a reason", b.pos(), b.mark)
				}
			default:
				t.Errorf("%s: command block without a mark (%s run by TEST, chart: ..., or not testable here: ... -->)", b.pos(), guideMarker)
			}
			cmds, err := b.commands()
			if err != nil {
				t.Error(err)
				continue
			}
			for _, pipeline := range cmds {
				for _, words := range pipeline {
					if len(words) > 0 && words[0] == "estuary" {
						estuaryCmds++
						checkEstuaryFlags(t, b, words[1:])
					}
				}
			}
		case "yaml":
			yamlDocs += checkGuideYAML(t, b)
		}
	}
	// A scan that finds nothing would pass.
	if shBlocks < 6 || estuaryCmds < 4 || yamlDocs < 3 {
		t.Errorf("found %d command blocks, %d estuary commands and %d YAML documents: is the scan broken?", shBlocks, estuaryCmds, yamlDocs)
	}
}

// checkEstuaryFlags runs the real binary with the guide's arguments and
// -h after them: the flag package parses every flag before it reaches -h,
// so an unknown flag, or a command that does not exist, fails here.
func checkEstuaryFlags(t *testing.T, b guideBlock, args []string) {
	t.Helper()
	cmd := exec.Command(estuaryBin, append(slices.Clone(args), "-h")...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	_ = cmd.Run()
	if out := stderr.String(); !strings.Contains(out, "Usage of ") || strings.Contains(out, "flag provided but not defined") {
		t.Errorf("%s: estuary %s: not accepted:\n%s", b.pos(), strings.Join(args, " "), out)
	}
}

// checkGuideYAML parses a YAML block and decodes its Kubernetes objects
// strictly. It returns the number of documents.
func checkGuideYAML(t *testing.T, b guideBlock) int {
	t.Helper()
	if b.file == "" {
		t.Errorf("%s: a YAML block starts with \"# FILE.yaml\", the name commands use", b.pos())
	}
	docs, err := yamlDocuments(b.text)
	if err != nil {
		t.Errorf("%s: %v", b.pos(), err)
	}
	for _, doc := range docs {
		if !bytes.Contains(doc, []byte("\"kind\"")) {
			continue // a values file
		}
		if _, err := strictObject(doc); err != nil {
			t.Errorf("%s: %v", b.pos(), err)
		}
	}
	return len(docs)
}

// yamlDocuments splits YAML text into its documents, as JSON.
func yamlDocuments(text string) ([][]byte, error) {
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(text), 4096)
	var out [][]byte
	for {
		var raw runtime.RawExtension
		if err := d.Decode(&raw); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return out, err
		}
		if len(raw.Raw) > 0 && string(raw.Raw) != "null" {
			out = append(out, raw.Raw)
		}
	}
}

// strictObject decodes one Kubernetes object, refusing unknown fields.
func strictObject(doc []byte) (runtime.Object, error) {
	s := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, kjson.SerializerOptions{Strict: true})
	obj, _, err := s.Decode(doc, nil, nil)
	return obj, err
}

// guideRun runs the guide's commands on two testbed clusters named by
// the kubeconfig contexts cluster1 and cluster2.
type guideRun struct {
	t          *testing.T
	dir        string // the working directory, holding the guide's files
	kubeconfig string
	kubes      map[string]*testbed.Kube
	files      map[string]string // YAML blocks by file name
	admin      string            // --admin for proxy-config and explain
	outputs    map[string]string // estuary subcommand -> its last stdout
}

// mergedKubeconfig writes one kubeconfig whose contexts are the clusters'
// names, as the guide assumes.
func (g *guideRun) mergedKubeconfig() {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Config\nclusters:\n")
	names := []string{"cluster1", "cluster2"}
	for _, n := range names {
		fmt.Fprintf(&b, "- name: %s\n  cluster:\n    server: %s\n    certificate-authority-data: %s\n", n, g.kubes[n].Server, base64.StdEncoding.EncodeToString(g.kubes[n].CAData))
	}
	b.WriteString("users:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "- name: %s-admin\n  user:\n    token: %s\n", n, g.kubes[n].Token)
	}
	b.WriteString("contexts:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "- name: %s\n  context:\n    cluster: %s\n    user: %s-admin\n", n, n, n)
	}
	b.WriteString("current-context: cluster1\n")
	g.kubeconfig = filepath.Join(g.dir, "kubeconfig")
	if err := os.WriteFile(g.kubeconfig, []byte(b.String()), 0o600); err != nil {
		g.t.Fatal(err)
	}
}

// run runs one command of the guide: estuary as written (with the
// merged kubeconfig, and --admin for the commands that read a host), and
// the kubectl commands the guide uses as the same API calls.
func (g *guideRun) run(b guideBlock, pipeline [][]string) {
	t := g.t
	t.Helper()
	var stdin []byte
	for i, words := range pipeline {
		if len(words) == 0 {
			t.Fatalf("%s: empty command", b.pos())
		}
		switch words[0] {
		case "estuary":
			args := slices.Clone(words[1:])
			if args[0] == "proxy-config" || args[0] == "explain" {
				args = append(args, "--admin", g.admin)
			}
			cmd := exec.Command(estuaryBin, args...)
			cmd.Dir = g.dir
			cmd.Env = append(os.Environ(), "KUBECONFIG="+g.kubeconfig)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %s: %v\n%s", b.pos(), strings.Join(words, " "), err, stderr.String())
			}
			g.outputs[args[0]] = string(out)
			stdin = out
		case "kubectl":
			g.kubectl(b, words[1:], stdin, i > 0)
			stdin = nil
		default:
			t.Fatalf("%s: the walkthrough cannot run %q: mark its block %s, or teach %s", b.pos(), words[0], markNotTestable, walkthrough)
		}
	}
}

// kubectl does what the guide's kubectl commands do, through client-go.
func (g *guideRun) kubectl(b guideBlock, args []string, stdin []byte, piped bool) {
	t := g.t
	t.Helper()
	ctx := context.Background()
	var kctx, ns string
	var rest []string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--context":
			i++
			kctx = args[i]
		case "-n", "--namespace":
			i++
			ns = args[i]
		default:
			rest = append(rest, args[i])
		}
	}
	k := g.kubes[kctx]
	if k == nil {
		t.Fatalf("%s: kubectl needs --context cluster1 or cluster2: %v", b.pos(), args)
	}
	c := k.Client()
	verb := strings.Join(rest, " ")
	switch {
	case len(rest) == 3 && rest[0] == "create" && rest[1] == "namespace":
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rest[2]}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: %s: %v", b.pos(), verb, err)
		}
	case len(rest) == 4 && rest[0] == "label" && (rest[1] == "namespace" || rest[1] == "service"):
		key, value, ok := strings.Cut(rest[3], "=")
		if !ok {
			t.Fatalf("%s: %s: not KEY=VALUE", b.pos(), verb)
		}
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, key, value)
		var err error
		if rest[1] == "namespace" {
			_, err = c.CoreV1().Namespaces().Patch(ctx, rest[2], types.MergePatchType, patch, metav1.PatchOptions{})
		} else {
			_, err = c.CoreV1().Services(ns).Patch(ctx, rest[2], types.MergePatchType, patch, metav1.PatchOptions{})
		}
		if err != nil {
			t.Fatalf("%s: %s: %v", b.pos(), verb, err)
		}
	case len(rest) == 3 && rest[0] == "apply" && rest[1] == "-f":
		text := string(stdin)
		if rest[2] != "-" {
			var ok bool
			if text, ok = g.files[rest[2]]; !ok {
				t.Fatalf("%s: %s: the guide has no YAML block %q", b.pos(), verb, rest[2])
			}
		} else if !piped {
			t.Fatalf("%s: %s: nothing piped in", b.pos(), verb)
		}
		docs, err := yamlDocuments(text)
		if err != nil || len(docs) == 0 {
			t.Fatalf("%s: %s: %d documents, %v", b.pos(), verb, len(docs), err)
		}
		for _, doc := range docs {
			obj, err := strictObject(doc)
			if err != nil {
				t.Fatalf("%s: %s: %v", b.pos(), verb, err)
			}
			applyObject(t, c, b, obj)
		}
	default:
		t.Fatalf("%s: the walkthrough cannot run kubectl %s: mark its block %s, or teach %s", b.pos(), verb, markNotTestable, walkthrough)
	}
}

// applyObject creates obj, or replaces it, as kubectl apply would.
func applyObject(t *testing.T, c kubernetes.Interface, b guideBlock, obj runtime.Object) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch o := obj.(type) {
	case *corev1.Service:
		if _, err = c.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			err = nil // the guide applies each manifest once
		}
	case *corev1.Secret:
		if _, err = c.CoreV1().Secrets(o.Namespace).Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			var old *corev1.Secret
			if old, err = c.CoreV1().Secrets(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{}); err == nil {
				o.ResourceVersion = old.ResourceVersion
				_, err = c.CoreV1().Secrets(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
			}
		}
	default:
		t.Fatalf("%s: the walkthrough cannot apply a %T", b.pos(), obj)
	}
	if err != nil {
		t.Fatalf("%s: apply: %v", b.pos(), err)
	}
}

// guideHCL is the guide's plugins.hcl for cluster (the guide's is
// cluster1's; cluster2's says cluster2 and network2), made runnable here:
// its xds and admin blocks are replaced by loopback ones (the admin one
// keeping a token file), and the kubernetes plugin reads the cluster
// through the merged kubeconfig instead of a pod's service account.
func (g *guideRun) guideHCL(blocks []guideBlock, cluster string) func(xds, admin string) string {
	t := g.t
	t.Helper()
	var src string
	for _, b := range blocks {
		if b.lang == "hcl" {
			src = b.text
			break
		}
	}
	if cluster == "cluster2" {
		src = strings.NewReplacer("cluster1", "cluster2", "network1", "network2").Replace(src)
	}
	f, diags := hclwrite.ParseConfig([]byte(src), guidePath, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	for _, blk := range f.Body().Blocks() {
		if blk.Type() == "xds" || blk.Type() == "admin" {
			f.Body().RemoveBlock(blk)
		}
	}
	out := string(f.Bytes())
	if strings.Count(out, "config {\n") != 1 {
		t.Fatalf("the guide's plugins.hcl should have one config block (the kubernetes plugin's):\n%s", out)
	}
	out = strings.Replace(out, "config {\n", fmt.Sprintf("config {\n    kubeconfig = %q\n    context    = %q\n", g.kubeconfig, cluster), 1)
	token := filepath.Join(g.dir, "admin-token")
	return func(xds, admin string) string {
		return out + fmt.Sprintf("xds {\n  listen         = %q\n  debounce_after = \"10ms\"\n}\nadmin {\n  listen     = %q\n  token_file = %q\n}\n", xds, admin, token)
	}
}

// sampleWithSidecar writes what a deployment with an injected sidecar
// leaves in a cluster that has no kubelet: service helloworld (port http
// 5000) in namespace sample, and one pod, labelled for Istio mTLS, behind
// it at podIP.
func sampleWithSidecar(t *testing.T, c kubernetes.Interface, podIP string) {
	t.Helper()
	ctx := context.Background()
	ns := "sample"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "helloworld", "security.istio.io/tlsMode": "istio"}
	pod, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "helloworld-1", Namespace: ns, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "helloworld", Image: "helloworld"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "helloworld", Namespace: ns},
		Spec:       corev1.ServiceSpec{Selector: map[string]string{"app": "helloworld"}, Ports: []corev1.ServicePort{{Name: "http", Port: 5000}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready := true
	port, name := int32(5000), "http"
	if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "helloworld-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "helloworld"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{podIP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod.Name, UID: pod.UID}}},
		Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestDeployGuideWalkthrough runs deploy/README.md on two real API
// servers: its network labels, gateway Services and remote secrets, then
// Estuary in each cluster with the guide's plugins.hcl, and its
// proxy-config and explain commands. A client in cluster1 gets its own
// endpoint and cluster2's gateway, and one in cluster2 the reverse.
// What the guide marks not testable is done here as the cloud and the
// kubelet would: the gateways' load balancer addresses, the sample's
// pods and EndpointSlices, and (no kube-controller-manager) the tokens.
func TestDeployGuideWalkthrough(t *testing.T) {
	blocks := readGuide(t)
	kubes := testbed.StartKubes(t, 2)
	g := &guideRun{t: t, dir: t.TempDir(), files: map[string]string{}, outputs: map[string]string{},
		kubes: map[string]*testbed.Kube{"cluster1": kubes[0], "cluster2": kubes[1]}}
	for _, k := range kubes {
		standInTokenController(t, k)
	}
	g.mergedKubeconfig()
	if err := os.WriteFile(filepath.Join(g.dir, "admin-token"), []byte(guideAdminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var runs, checks []guideBlock
	for _, b := range blocks {
		if b.file != "" {
			g.files[b.file] = b.text
		}
		if b.lang == "sh" && b.mark == markRunBy+walkthrough {
			if strings.Contains(b.text, "estuary proxy-config") || strings.Contains(b.text, "estuary explain") {
				checks = append(checks, b)
			} else if len(checks) > 0 {
				t.Fatalf("%s: a step after the checks", b.pos())
			} else {
				runs = append(runs, b)
			}
		}
	}
	if len(runs) < 3 || len(checks) != 1 {
		t.Fatalf("%d steps and %d checks run by %s: is the scan broken?", len(runs), len(checks), walkthrough)
	}
	for _, b := range runs {
		cmds, err := b.commands()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range cmds {
			g.run(b, p)
		}
	}

	// What the cloud and the kubelet would do.
	gateways := map[string]string{"cluster1": "192.0.2.1", "cluster2": "192.0.2.2"}
	pods := map[string]string{"cluster1": "10.1.0.1", "cluster2": "10.2.0.1"}
	for name, k := range g.kubes {
		svc, err := k.Client().CoreV1().Services("istio-system").Get(context.Background(), "estuary-eastwestgateway", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: gateways[name]}}
		if _, err := k.Client().CoreV1().Services("istio-system").UpdateStatus(context.Background(), svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		sampleWithSidecar(t, k.Client(), pods[name])
	}

	h1 := startHostFile(t, g.guideHCL(blocks, "cluster1"))
	h2 := startHostFile(t, g.guideHCL(blocks, "cluster2"))
	h1.adminToken, h2.adminToken = guideAdminToken, guideAdminToken
	g.admin = strings.TrimPrefix(h1.admin, "http://")
	cmds, err := checks[0].commands()
	if err != nil {
		t.Fatal(err)
	}
	node := ""
	for i, w := range cmds[0][0] {
		if w == "--node" {
			node = cmds[0][0][i+1]
		}
	}
	host := "helloworld.sample.svc.cluster.local"
	eventuallyEndpointsOn(t, h1, node, map[string]any{"CLUSTER_ID": "cluster1", "NETWORK": "network1"}, host, 5000, 2,
		[]string{"10.1.0.1:5000 w=1", "192.0.2.2:15443 w=1"})
	eventuallyEndpointsOn(t, h2, "sidecar~10.2.0.9~sleep.sample~sample.svc.cluster.local", map[string]any{"CLUSTER_ID": "cluster2", "NETWORK": "network2"}, host, 5000, 2,
		[]string{"10.2.0.1:5000 w=1", "192.0.2.1:15443 w=1"})

	for _, p := range cmds {
		g.run(checks[0], p)
	}
	pc, ex := g.outputs["proxy-config"], g.outputs["explain"]
	for _, want := range []string{"10.1.0.1:5000", "192.0.2.2:15443", "network2", model.ClusterName(5000, "", host)} {
		if !strings.Contains(pc, want) {
			t.Errorf("proxy-config does not show %s:\n%s", want, pc)
		}
	}
	for _, want := range []string{"10.2.0.1:5000", "192.0.2.2:15443", "gateway", "This matches what the xDS server holds"} {
		if !strings.Contains(ex, want) {
			t.Errorf("explain does not show %q:\n%s", want, ex)
		}
	}
}
