package serviceentry

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"
)

const goodEntry = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: good
  namespace: ns1
spec:
  hosts: [good.example.com]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: DNS
`

// TestBadInput checks that each kind of bad object is rejected with its
// file, line, document index and field path, and that only that object is
// skipped: the good documents around it are accepted.
func TestBadInput(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		// wantPath and wantMsg must both appear in the rejection.
		wantPath, wantMsg string
		// wantUnreadable: the object cannot be identified.
		wantUnreadable bool
	}{
		{"malformed YAML", "kind: ServiceEntry\nmetadata: {name: x\nspec: [\n", "", "malformed YAML: yaml: line 12:", true},
		{"not an object", "- just\n- a list\n", "", "not a Kubernetes object", true},
		{"unknown kind", "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw}\nspec: {}\n", "kind", `unknown kind "Gateway"`, false},
		{"missing kind", "apiVersion: networking.istio.io/v1\nmetadata: {name: x}\nspec: {}\n", "kind", "missing", false},
		{"foreign group", "apiVersion: example.com/v1\nkind: ServiceEntry\nmetadata: {name: x}\nspec: {hosts: [a.b]}\n", "apiVersion", `"example.com/v1" is not served`, false},
		{"missing name", "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {}\nspec: {hosts: [a.b]}\n", "metadata.name", "missing", true},
		{"missing spec", "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: x}\n", "spec", "missing", false},
		{"missing host", entry("ports: [{number: 80, name: http}]"), "spec.hosts", "at least one host", false},
		{"empty host", entry("hosts: ['']"), "spec.hosts[0]", "empty host", false},
		{"star host", entry("hosts: ['*']"), "spec.hosts[0]", `"*" is not allowed`, false},
		{"bad host", entry("hosts: ['a..b']"), "spec.hosts[0]", `invalid host "a..b"`, false},
		{"port without number", entry("hosts: [a.b]\n  ports: [{name: http}]"), "spec.ports[0].number", "port without number", false},
		{"port out of range", entry("hosts: [a.b]\n  ports: [{name: http, number: 70000}]"), "spec.ports[0].number", "not between 1 and 65535", false},
		{"port without name", entry("hosts: [a.b]\n  ports: [{number: 80}]"), "spec.ports[0].name", "port without name", false},
		{"duplicate port number", entry("hosts: [a.b]\n  ports: [{number: 80, name: a}, {number: 80, name: b}]"), "spec.ports[1].number", "declared twice", false},
		{"duplicate port name", entry("hosts: [a.b]\n  ports: [{number: 80, name: a}, {number: 81, name: a}]"), "spec.ports[1].name", "declared twice", false},
		{"unknown protocol", entry("hosts: [a.b]\n  ports: [{number: 80, name: a, protocol: QUIC}]"), "spec.ports[0].protocol", `unknown protocol "QUIC"`, false},
		{"bad address", entry("hosts: [a.b]\n  addresses: [not-an-ip]"), "spec.addresses[0]", "neither an IP address nor a CIDR", false},
		{"CIDR with DNS", entry("hosts: [a.b]\n  resolution: DNS\n  addresses: [10.0.0.0/8]\n  ports: [{number: 80, name: a, protocol: TCP}]"), "spec.addresses[0]", "NONE or STATIC", false},
		{"non-IP with STATIC", entry("hosts: [a.b]\n  ports: [{number: 80, name: a}]\n  resolution: STATIC\n  endpoints: [{address: 10.0.0.1}, {address: backend.example.com}]"), "spec.endpoints[1].address", `"backend.example.com" is not an IP address (resolution STATIC)`, false},
		{"selector with endpoints", entry("hosts: [a.b]\n  resolution: STATIC\n  workloadSelector: {labels: {app: a}}\n  endpoints: [{address: 10.0.0.1}]"), "spec.workloadSelector", "cannot be used together with spec.endpoints", false},
		{"NONE with endpoints", entry("hosts: [a.b]\n  resolution: NONE\n  endpoints: [{address: 10.0.0.1}]"), "spec.endpoints", "resolution NONE takes no endpoints", false},
		{"round robin with two endpoints", entry("hosts: [a.b]\n  resolution: DNS_ROUND_ROBIN\n  endpoints: [{address: x.y}, {address: y.z}]"), "spec.endpoints", "at most one endpoint", false},
		{"dynamic DNS", entry("hosts: ['*.a.b']\n  resolution: DYNAMIC_DNS"), "spec.resolution", "DYNAMIC_DNS is not supported", false},
		{"wildcard DNS without endpoints", entry("hosts: ['*.a.b']\n  ports: [{number: 80, name: a}]\n  resolution: DNS"), "spec.hosts[0]", "wildcard host", false},
		{"endpoint without address", entry("hosts: [a.b]\n  resolution: STATIC\n  endpoints: [{labels: {a: b}}]"), "spec.endpoints[0].address", "missing", false},
		{"network-only endpoint with DNS", entry("hosts: [a.b]\n  resolution: DNS\n  endpoints: [{network: n2}]"), "spec.endpoints[0].address", "needs resolution STATIC", false},
		{"endpoint port out of range", entry("hosts: [a.b]\n  ports: [{number: 80, name: a}]\n  resolution: STATIC\n  endpoints: [{address: 10.0.0.1, ports: {a: 0}}]"), "spec.endpoints[0].ports.a", "not between 1 and 65535", false},
		{"unix socket relative", entry("hosts: [a.b]\n  ports: [{number: 80, name: a}]\n  resolution: STATIC\n  endpoints: [{address: 'unix://run/x.sock'}]"), "spec.endpoints[0].address", "absolute path", false},
		{"unix socket with ports", entry("hosts: [a.b]\n  ports: [{number: 80, name: a}]\n  resolution: STATIC\n  endpoints: [{address: 'unix:///x.sock', ports: {a: 90}}]"), "spec.endpoints[0].ports", "takes no ports", false},
		{"unix socket two ports", entry("hosts: [a.b]\n  ports: [{number: 80, name: a}, {number: 81, name: b}]\n  resolution: STATIC\n  endpoints: [{address: 'unix:///x.sock'}]"), "spec.endpoints[0].address", "exactly one port", false},
		{"unix socket with DNS", entry("hosts: [a.b]\n  ports: [{number: 80, name: a}]\n  resolution: DNS\n  endpoints: [{address: 'unix:///x.sock'}]"), "spec.endpoints[0].address", "needs resolution STATIC", false},
		{"bad exportTo", entry("hosts: [a.b]\n  exportTo: ['Not_A_Namespace']"), "spec.exportTo[0]", "not \".\"", false},
		{"star exportTo combined", entry("hosts: [a.b]\n  exportTo: ['*', 'ns1']"), "spec.exportTo[0]", "cannot be combined", false},
		{"wildcard selector", entry("hosts: [a.b]\n  resolution: STATIC\n  workloadSelector: {labels: {app: '*'}}"), "spec.workloadSelector.labels.app", "wildcards", false},
		{"bad enum", entry("hosts: [a.b]\n  resolution: MAGIC"), "spec", "MAGIC", false},
		{"bad field type", entry("hosts: a.b"), "spec", "", false},
		{"workload entry without address", "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: w}\nspec: {labels: {a: b}}\n", "spec.address", "missing", false},
		{"workload entry bad address", "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: w}\nspec: {address: 'not an address'}\n", "spec.address", "neither an IP address", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The bad document sits between two good ones, starting on line 11.
			src := goodEntry + "---\n" + tt.doc + "---\n" + strings.Replace(goodEntry, "name: good", "name: good2", 1)
			docs := decodeFile("dir/se.yaml", []byte(src), "default")
			if len(docs) != 3 {
				t.Fatalf("decoded %d documents, want 3", len(docs))
			}
			if docs[0].obj == nil || docs[2].obj == nil {
				t.Fatalf("the good documents around the bad one were rejected: %v / %v", docs[0].errs, docs[2].errs)
			}
			d := docs[1]
			if d.obj != nil {
				t.Fatalf("accepted %s; want a rejection at %q", d.obj.key, tt.wantPath)
			}
			if want := "dir/se.yaml:11, document 2"; !strings.Contains(d.subject(), want) {
				t.Errorf("subject %q does not locate the document (%s)", d.subject(), want)
			}
			if !slices.ContainsFunc(d.errs, func(e fieldError) bool { return e.path == tt.wantPath && strings.Contains(e.msg, tt.wantMsg) }) {
				t.Errorf("errors %q lack %q at path %q", d.errs.Error(), tt.wantMsg, tt.wantPath)
			}
			if d.unreadable != tt.wantUnreadable {
				t.Errorf("unreadable = %v, want %v", d.unreadable, tt.wantUnreadable)
			}
		})
	}
}

// entry wraps spec lines into a ServiceEntry document.
func entry(spec string) string {
	return fmt.Sprintf("apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: bad, namespace: ns1}\nspec:\n  %s\n", spec)
}

func TestAPIVersionsAndLists(t *testing.T) {
	tests := []struct {
		name, src string
		want      []objectKey
	}{
		{"v1", strings.Replace(goodEntry, "v1\n", "v1\n", 1), []objectKey{{kindServiceEntry, "ns1", "good"}}},
		{"v1beta1", strings.Replace(goodEntry, "networking.istio.io/v1", "networking.istio.io/v1beta1", 1), []objectKey{{kindServiceEntry, "ns1", "good"}}},
		{"v1alpha3", strings.Replace(goodEntry, "networking.istio.io/v1", "networking.istio.io/v1alpha3", 1), []objectKey{{kindServiceEntry, "ns1", "good"}}},
		{"default namespace", strings.Replace(goodEntry, "  namespace: ns1\n", "", 1), []objectKey{{kindServiceEntry, "dflt", "good"}}},
		{"JSON", `{"apiVersion":"networking.istio.io/v1","kind":"WorkloadEntry","metadata":{"name":"w","namespace":"ns"},"spec":{"address":"10.0.0.1"}}`,
			[]objectKey{{kindWorkloadEntry, "ns", "w"}}},
		{"kubectl list", `apiVersion: v1
kind: List
items:
- apiVersion: networking.istio.io/v1
  kind: ServiceEntry
  metadata: {name: a, namespace: ns}
  spec: {hosts: [a.b], resolution: DNS, ports: [{number: 80, name: http}]}
- apiVersion: networking.istio.io/v1
  kind: WorkloadEntry
  metadata: {name: w, namespace: ns}
  spec: {address: 10.0.0.1}
`, []objectKey{{kindServiceEntry, "ns", "a"}, {kindWorkloadEntry, "ns", "w"}}},
		{"separators and comments", "# leading comment\n---\n---   # empty\n" + goodEntry + "--- # next\n\n", []objectKey{{kindServiceEntry, "ns1", "good"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []objectKey
			for _, d := range decodeFile("f.yaml", []byte(tt.src), "dflt") {
				if d.obj == nil {
					t.Fatalf("rejected %s: %v", d.subject(), d.errs)
				}
				got = append(got, d.obj.key)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("objects = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSplitDocumentsPositions(t *testing.T) {
	src := "# header\n---\na: 1\n---\n\n# only a comment\n---\nb: 2\nc: 3\n----\nd: 4\n"
	docs := splitDocuments([]byte(src))
	type pos struct{ index, line int }
	var got []pos
	for _, d := range docs {
		got = append(got, pos{d.index, d.line})
	}
	// "----" is not a separator: it belongs to the third document.
	want := []pos{{1, 3}, {2, 8}}
	if !slices.Equal(got, want) {
		t.Errorf("documents at %v, want %v", got, want)
	}
}

// TestSpecDecoderMatchesIstio checks that decodeSpec decodes every spec of
// the test inputs exactly as the istio.io/api types' own UnmarshalJSON does,
// fails where it fails, and warns where its fast path refused.
func TestSpecDecoderMatchesIstio(t *testing.T) {
	inputs, err := filepath.Glob("testdata/convert/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type doc struct {
		data []byte
		// warn, if set, is the warning decodeSpec must give; "-" for none.
		warn string
	}
	var docs []doc
	for _, in := range inputs {
		src, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range splitDocuments(src) {
			docs = append(docs, doc{data: d.data})
		}
	}
	for _, e := range []struct{ spec, warn string }{
		{"hosts: [a.b]\n  unknownField: 1\n  ports: [{number: '80', name: a, protocol: HTTP}]", `unknown field "unknownField"; ignored`},
		{"hosts: [a.b]\n  ports: [{number: 80, name: a, extra: x}]", `unknown field "extra"; ignored`},
		{"hosts: [a.b]\n  resolution: 2\n  location: 1", "-"},
		{"hosts: [a.b]\n  workload_selector: {labels: {app: a}}\n  export_to: ['.']", "-"},
		{"hosts: [a.b]\n  resolution: MAGIC", ""},
		{"hosts: a.b", ""},
		{"hosts: [a.b]\n  endpoints: [{address: 10.0.0.1, weight: -1}]", ""},
		{"hosts: [a.b]\n  endpoints: [{address: 10.0.0.1, ports: {a: 99999999999}}]", ""},
	} {
		docs = append(docs, doc{data: []byte(entry(e.spec)), warn: e.warn})
	}
	compared := 0
	for i, d := range docs {
		js, err := yaml.YAMLToJSON(d.data)
		if err != nil {
			continue // not a document with a spec
		}
		var env envelope
		if json.Unmarshal(js, &env) != nil || len(env.Spec) == 0 {
			continue
		}
		var theirs, ours proto.Message
		var theirErr, ourErr error
		var warning string
		switch env.Kind {
		case kindServiceEntry:
			a, b := new(networking.ServiceEntry), new(networking.ServiceEntry)
			theirErr = a.UnmarshalJSON(env.Spec)
			warning, ourErr = decodeSpec(env.Spec, b)
			theirs, ours = a, b
		case kindWorkloadEntry:
			a, b := new(networking.WorkloadEntry), new(networking.WorkloadEntry)
			theirErr = a.UnmarshalJSON(env.Spec)
			warning, ourErr = decodeSpec(env.Spec, b)
			theirs, ours = a, b
		default:
			continue
		}
		compared++
		switch {
		case (theirErr == nil) != (ourErr == nil):
			t.Errorf("document %d: istio.io/api says %v, decodeSpec says %v\n%s", i, theirErr, ourErr, env.Spec)
		case theirErr == nil && !proto.Equal(theirs, ours):
			t.Errorf("document %d decodes differently:\nistio.io/api: %v\ndecodeSpec:   %v", i, theirs, ours)
		case d.warn == "-" && warning != "", d.warn != "" && d.warn != "-" && warning != d.warn:
			t.Errorf("document %d: warning %q, want %q\n%s", i, warning, strings.TrimPrefix(d.warn, "-"), env.Spec)
		}
	}
	if compared < 30 {
		t.Errorf("compared only %d specs", compared)
	}
}
