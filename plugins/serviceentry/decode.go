package serviceentry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/estuary-mesh/estuary/sdk"
)

// The API group of the objects this plugin reads, and the versions accepted
// for it. They all carry the same schema: v1 and v1beta1 are aliases of
// v1alpha3, whose Go types decode every one of them.
const istioGroup = "networking.istio.io"

var istioVersions = []string{"v1", "v1beta1", "v1alpha3"}

// istioMessage is an istio.io/api type with its own JSON decoder.
type istioMessage interface {
	proto.Message
	UnmarshalJSON([]byte) error
}

// decodeSpec decodes a spec into its istio.io/api type m. The types' own
// UnmarshalJSON is golang/protobuf's deprecated jsonpb, unknown fields
// allowed; it decides, but it is slow. Most specs take the fast path:
// protojson (the decoder jsonpb is built on), strict, which only accepts
// what jsonpb accepts too (TestSpecDecoderMatchesIstio checks both agree).
// When it refuses, jsonpb decodes, and what protojson refused (an unknown
// field, say) comes back as a warning.
func decodeSpec(spec []byte, m istioMessage) (warning string, err error) {
	strictErr := protojson.Unmarshal(spec, m)
	if strictErr == nil {
		return "", nil
	}
	proto.Reset(m)
	if err := m.UnmarshalJSON(spec); err != nil {
		return "", errors.New(protoError(strictErr))
	}
	return protoError(strictErr) + "; ignored", nil
}

// protoErrorPrefix matches protojson's "proto: (line 1:23): ", whose
// position is in the JSON the YAML was turned into, not in the file.
var protoErrorPrefix = regexp.MustCompile(`^proto:[\s\x{00a0}]*(\(line \d+:\d+\):[\s\x{00a0}]*)?`)

func protoError(err error) string { return protoErrorPrefix.ReplaceAllString(err.Error(), "") }

// Kinds this plugin reads.
const (
	kindServiceEntry  = "ServiceEntry"
	kindWorkloadEntry = "WorkloadEntry"
)

// objectKey identifies an object the way Kubernetes does.
type objectKey struct {
	Kind, Namespace, Name string
}

func (k objectKey) String() string { return k.Kind + " " + k.Namespace + "/" + k.Name }

// object is one accepted ServiceEntry or WorkloadEntry. It is immutable once
// decoded: builds share it.
type object struct {
	key     objectKey
	created time.Time
	labels  map[string]string
	// origin says where the object came from, for messages:
	// "/etc/se/a.yaml:14, document 2" or "kubernetes".
	origin string
	se     *networking.ServiceEntry  // kind ServiceEntry
	we     *networking.WorkloadEntry // kind WorkloadEntry
	// warnings are problems that do not reject the object.
	warnings []string
	// unhealthy: a WorkloadEntry whose status condition Healthy is not
	// True (istiod's health checks write it).
	unhealthy bool
	// mtlsMode is a ServiceEntry's own mTLS mode, from the annotation
	// sdk.AnnotationMTLSMode: what Istio would read from a DestinationRule.
	mtlsMode sdk.MTLSMode
	// localityFailover is a ServiceEntry's own locality failover, from
	// the annotation sdk.AnnotationLocalityFailover: what Istio would
	// read from a DestinationRule's localityLbSetting.
	localityFailover sdk.LocalityFailover
}

// subject names the object in notices.
func (o *object) subject() string { return o.key.String() + " (" + o.origin + ")" }

// fieldError is one problem at a field path inside an object, written the
// Kubernetes way: spec.endpoints[2].address.
type fieldError struct {
	path, msg string
}

func (e fieldError) String() string {
	if e.path == "" {
		return e.msg
	}
	return e.path + ": " + e.msg
}

// fieldErrors collects every problem of an object.
type fieldErrors []fieldError

func (es *fieldErrors) add(path, format string, args ...any) {
	*es = append(*es, fieldError{path: path, msg: fmt.Sprintf(format, args...)})
}

func (es fieldErrors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.String()
	}
	return strings.Join(parts, "; ")
}

// decoded is the outcome of decoding one object.
type decoded struct {
	// obj is the accepted object; nil if it was rejected.
	obj *object
	// key identifies the object; zero if the document could not be read far
	// enough to tell what it is.
	key objectKey
	// where locates the object, for messages (see object.origin).
	where string
	errs  fieldErrors
	// unreadable is set when the document could not be read far enough to
	// tell which object it defines (malformed YAML, no name).
	unreadable bool
}

// subject names the decoded object (or just its position) in notices.
func (d *decoded) subject() string {
	if d.key == (objectKey{}) {
		return d.where
	}
	return d.key.String() + " (" + d.where + ")"
}

// document is one YAML document of a file.
type document struct {
	// index counts the file's non-empty documents from 1.
	index int
	// line is the file line the document starts on, from 1.
	line int
	data []byte
}

// splitDocuments cuts a YAML stream at its "---" separator lines. Documents
// holding nothing but blank lines and comments are dropped (they do not
// count for the index either).
func splitDocuments(src []byte) []document {
	var docs []document
	start, startLine, line := 0, 1, 1
	flush := func(end int) {
		if d := src[start:end]; !blankYAML(d) {
			docs = append(docs, document{index: len(docs) + 1, line: startLine, data: d})
		}
	}
	for off := 0; off < len(src); line++ {
		end := bytes.IndexByte(src[off:], '\n')
		next := len(src)
		if end >= 0 {
			next = off + end + 1
		}
		if isSeparator(src[off:next]) {
			flush(off)
			start, startLine = next, line+1
		}
		off = next
	}
	flush(len(src))
	return docs
}

// isSeparator reports whether a line is a YAML document separator: "---",
// optionally followed by blanks or a comment.
func isSeparator(line []byte) bool {
	rest, ok := bytes.CutPrefix(line, []byte("---"))
	if !ok {
		return false
	}
	rest = bytes.TrimSpace(rest)
	return len(rest) == 0 || rest[0] == '#'
}

func blankYAML(d []byte) bool {
	for l := range bytes.Lines(d) {
		l = bytes.TrimSpace(l)
		if len(l) > 0 && l[0] != '#' {
			return false
		}
	}
	return true
}

// decodeFile decodes every document of a YAML (or JSON) file. A document
// with a `kind: List` yields one result per item.
func decodeFile(path string, src []byte, defaultNamespace string) []decoded {
	var out []decoded
	for _, doc := range splitDocuments(src) {
		where := fmt.Sprintf("%s:%d, document %d", path, doc.line, doc.index)
		js, err := yaml.YAMLToJSON(doc.data)
		if err != nil {
			// Decode again with the document at its place in the file, so
			// that the parser's line numbers are the file's.
			padded := append(bytes.Repeat([]byte{'\n'}, doc.line-1), doc.data...)
			if _, perr := yaml.YAMLToJSON(padded); perr != nil {
				err = perr
			}
			out = append(out, decoded{where: where, unreadable: true, errs: fieldErrors{{msg: "malformed YAML: " + err.Error()}}})
			continue
		}
		out = append(out, decodeJSON(js, where, defaultNamespace)...)
	}
	return out
}

// envelope is what every object carries: Kubernetes type and object
// metadata, with the spec left to Istio's own types. Items is set for lists
// (`kubectl get -o yaml` output).
type envelope struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            json.RawMessage   `json:"spec"`
	Status          *objectStatus     `json:"status"`
	Items           []json.RawMessage `json:"items"`
}

// objectStatus is the part of an Istio object's status the plugin reads:
// the conditions (istio.io/api meta.v1alpha1 IstioStatus). istiod's health
// checker writes a WorkloadEntry's "Healthy" condition.
type objectStatus struct {
	Conditions []struct {
		Type   string `json:"type"`
		Status string `json:"status"`
	} `json:"conditions"`
}

// unhealthy reports a "Healthy" condition that is not "True". Without
// that condition, as Istio does, the workload is healthy.
func (s *objectStatus) unhealthy() bool {
	if s == nil {
		return false
	}
	for _, c := range s.Conditions {
		if c.Type == "Healthy" {
			return c.Status != "True"
		}
	}
	return false
}

// decodeJSON decodes one object (or a list of them) given as JSON. where
// locates it for messages; objects without a namespace get
// defaultNamespace.
func decodeJSON(js []byte, where, defaultNamespace string) []decoded {
	var env envelope
	if err := json.Unmarshal(js, &env); err != nil {
		return []decoded{{where: where, unreadable: true, errs: fieldErrors{{msg: "not a Kubernetes object: " + err.Error()}}}}
	}
	if strings.HasSuffix(env.Kind, "List") && env.Items != nil {
		var out []decoded
		for i, item := range env.Items {
			out = append(out, decodeJSON(item, where+", items["+strconv.Itoa(i)+"]", defaultNamespace)...)
		}
		return out
	}
	d := decoded{where: where}
	gv, err := schema.ParseGroupVersion(env.APIVersion)
	switch {
	case env.Kind == "":
		d.errs.add("kind", "missing (want %s or %s)", kindServiceEntry, kindWorkloadEntry)
	case env.Kind != kindServiceEntry && env.Kind != kindWorkloadEntry:
		d.errs.add("kind", "unknown kind %q (want %s or %s)", env.Kind, kindServiceEntry, kindWorkloadEntry)
	case err != nil || gv.Group != istioGroup || !knownVersion(gv.Version):
		d.errs.add("apiVersion", "%q is not served for %s (want %s/ followed by one of %s)",
			env.APIVersion, env.Kind, istioGroup, strings.Join(istioVersions, ", "))
	}
	if env.Metadata.Name == "" {
		d.errs.add("metadata.name", "missing")
		d.unreadable = true
	} else if env.Kind != "" {
		d.key = objectKey{Kind: env.Kind, Namespace: namespaceOr(env.Metadata.Namespace, defaultNamespace), Name: env.Metadata.Name}
	}
	if len(d.errs) > 0 {
		return []decoded{d}
	}
	if len(env.Spec) == 0 || bytes.Equal(env.Spec, []byte("null")) {
		d.errs.add("spec", "missing")
		return []decoded{d}
	}
	o := &object{key: d.key, created: env.Metadata.CreationTimestamp.Time, labels: env.Metadata.Labels, origin: where,
		unhealthy: env.Kind == kindWorkloadEntry && env.Status.unhealthy()}
	var warning string
	switch env.Kind {
	case kindServiceEntry:
		o.se = new(networking.ServiceEntry)
		warning, err = decodeSpec(env.Spec, o.se)
	case kindWorkloadEntry:
		o.we = new(networking.WorkloadEntry)
		warning, err = decodeSpec(env.Spec, o.we)
	}
	if err != nil {
		d.errs.add("spec", "%v", err)
		return []decoded{d}
	}
	if o.se != nil {
		d.errs, o.warnings = validateServiceEntry(o.se)
		if v, ok := env.Metadata.Annotations[sdk.AnnotationMTLSMode]; ok {
			m, err := sdk.ParseMTLSMode(v)
			if err != nil || m == sdk.MTLSModeUnset {
				o.warnings = append(o.warnings, fmt.Sprintf("metadata.annotations[%s]: %q ignored, the hosts follow the mesh's mTLS mode: want STRICT, PERMISSIVE or DISABLE", sdk.AnnotationMTLSMode, v))
			}
			o.mtlsMode = m
		}
		if v, ok := env.Metadata.Annotations[sdk.AnnotationLocalityFailover]; ok {
			f, err := sdk.ParseLocalityFailover(v)
			if err != nil {
				o.warnings = append(o.warnings, fmt.Sprintf("metadata.annotations[%s]: %q ignored, the hosts follow the mesh's locality_failover: want \"true\" or \"false\"", sdk.AnnotationLocalityFailover, v))
			}
			o.localityFailover = f
		}
	} else {
		d.errs = validateWorkloadEntry(o.we)
	}
	if warning != "" {
		o.warnings = append([]string{"spec: " + warning}, o.warnings...)
	}
	if len(d.errs) == 0 {
		d.obj = o
	}
	return []decoded{d}
}

func knownVersion(v string) bool {
	for _, x := range istioVersions {
		if v == x {
			return true
		}
	}
	return false
}

func namespaceOr(ns, def string) string {
	if ns == "" {
		return def
	}
	return ns
}
