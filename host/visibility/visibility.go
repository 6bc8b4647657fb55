// Package visibility decides which namespaces see a service: Istio's
// exportTo. A service says where it is exported (a ServiceEntry's
// spec.exportTo, a Kubernetes Service's networking.istio.io/exportTo
// annotation, a static service's export_to); a service that says nothing
// takes the mesh default (mesh.default_service_export_to, Istio's
// meshConfig.defaultServiceExportTo, "*" unless set).
//
// A client sees a service when the service is exported to the client's
// namespace, the namespace in its node id. The xDS server and
// `estuary explain service` both ask Decide, so what explain says is what
// the server did.
package visibility

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/estuary-mesh/estuary/host/aggregate"
	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/sdk"
)

// The values of an exportTo entry besides a namespace name.
const (
	Public  = "*" // every namespace
	Private = "." // the service's own namespace
	None    = "~" // no namespace
)

// DefaultExportTo is the mesh default when the mesh block sets none, as
// Istio's defaultServiceExportTo.
var DefaultExportTo = []string{Public}

// Validate checks an exportTo list as Istio's validation does: each entry
// is ".", "*", "~" or a namespace name (a DNS-1123 label), none twice, and
// "*" or "~" only alone. It returns one error per problem, each naming the
// entry's index, so the caller can point at it.
func Validate(list []string) []IndexedError {
	var errs []IndexedError
	seen := map[string]bool{}
	for i, e := range list {
		if seen[e] {
			errs = append(errs, IndexedError{i, fmt.Errorf("%q is listed twice", e)})
		}
		seen[e] = true
		switch e {
		case Public, None:
			if len(list) > 1 {
				errs = append(errs, IndexedError{i, fmt.Errorf("%q cannot be combined with other values", e)})
			}
		case Private:
		default:
			if msgs := validation.IsDNS1123Label(e); len(msgs) > 0 {
				errs = append(errs, IndexedError{i, fmt.Errorf("%q is not \".\", \"*\", \"~\" or a namespace name: %s", e, strings.Join(msgs, "; "))})
			}
		}
	}
	return errs
}

// IndexedError is a problem with the entry at Index of a list.
type IndexedError struct {
	Index int
	Err   error
}

func (e IndexedError) Error() string { return fmt.Sprintf("[%d]: %v", e.Index, e.Err) }

// Rules is what decides visibility besides the services themselves.
type Rules struct {
	// Default is the exportTo of services that set none; nil means "*".
	Default []string
}

// Decision is whether a namespace sees a service, and why.
type Decision struct {
	Hostname  string `json:"hostname"`
	Namespace string `json:"namespace"` // the client's
	// ServiceNamespace is the namespace "." stands for.
	ServiceNamespace string   `json:"service_namespace"`
	Visible          bool     `json:"visible"`
	ExportTo         []string `json:"export_to"`
	// Source says where ExportTo came from: the registry's field, or the
	// mesh default.
	Source string `json:"source"`
	Reason string `json:"reason"`
}

// Sources of an exportTo, as Decision.Source names them.
const (
	SourceMeshDefault  = "mesh default_service_export_to"
	SourceAnnotation   = "Kubernetes Service annotation networking.istio.io/exportTo"
	SourceServiceEntry = "ServiceEntry spec.exportTo"
	SourceStatic       = "static plugin export_to"
)

// exportTo returns the list that applies to svc and where it came from.
func (r *Rules) exportTo(svc *aggregate.Service) ([]string, string) {
	if len(svc.ExportTo) > 0 {
		return svc.ExportTo, sourceOf(svc)
	}
	if r == nil || r.Default == nil {
		return DefaultExportTo, SourceMeshDefault
	}
	return r.Default, SourceMeshDefault
}

// sourceOf names the field an instance's exportTo is read from: the first
// instance's, whose attributes the merged service carries.
func sourceOf(svc *aggregate.Service) string {
	if len(svc.Instances) == 0 {
		return "registry"
	}
	switch p := svc.Instances[0].Provider; p {
	case sdk.ProviderKubernetes:
		return SourceAnnotation
	case sdk.ProviderServiceEntry:
		return SourceServiceEntry
	case sdk.ProviderStatic:
		return SourceStatic
	default:
		return "export_to of the " + p + " registry"
	}
}

// Visible reports whether a client in namespace ns sees svc. It is the
// xDS server's hot path: no allocation.
func (r *Rules) Visible(svc *aggregate.Service, ns string) bool {
	list, _ := r.exportTo(svc)
	return match(list, svc.Namespace, ns) <= byName
}

// Exported reports whether svc is exported to every namespace, so that
// no namespace needs a look at it.
func (r *Rules) Exported(svc *aggregate.Service) bool {
	list, _ := r.exportTo(svc)
	return slices.Contains(list, Public)
}

// Decide says whether a client in namespace ns sees svc, and why.
func (r *Rules) Decide(svc *aggregate.Service, ns string) Decision {
	list, src := r.exportTo(svc)
	m := match(list, svc.Namespace, ns)
	return Decision{Hostname: svc.Hostname, Namespace: ns, ServiceNamespace: svc.Namespace,
		Visible: m <= byName, ExportTo: slices.Clone(list), Source: src, Reason: m.reason(svc.Namespace, ns)}
}

// rule is the rule that decided: the first three make a service visible.
type rule uint8

const (
	byPublic rule = iota
	byPrivate
	byName
	byNone
	noNamespace
	notListed
)

func (m rule) reason(svcNS, ns string) string {
	switch m {
	case byPublic:
		return `"*" exports it to every namespace`
	case byPrivate:
		return fmt.Sprintf(`"." exports it to its own namespace %q`, svcNS)
	case byName:
		return fmt.Sprintf("it is exported to namespace %q by name", ns)
	case byNone:
		return `"~" exports it to no namespace`
	case noNamespace:
		return "the node names no namespace, so it sees only services exported to \"*\""
	}
	return fmt.Sprintf("namespace %q is not in its exportTo", ns)
}

// match applies an exportTo list of a service in svcNS to a client in
// ns. As in Istio, a service exported only to other namespaces is not
// seen in its own, and a client whose namespace is unknown sees only what
// is exported to all.
func match(list []string, svcNS, ns string) rule {
	for _, e := range list {
		switch {
		case e == Public:
			return byPublic
		case ns == "":
		case e == Private && ns == svcNS:
			return byPrivate
		case e == ns:
			return byName
		}
	}
	switch {
	case slices.Contains(list, None):
		return byNone
	case ns == "":
		return noNamespace
	}
	return notListed
}

// Nodes is what the debug handler needs from the xDS server: a connected
// node's namespace, and the clusters of a service the server holds for it.
type Nodes interface {
	NodeClusters(node, host string) (namespace string, clusters []string, ok bool)
}

// Explanation is what /debug/visibilityz says about a service and a node.
type Explanation struct {
	Decision
	Node string `json:"node,omitempty"`
	// Connected is whether the node is connected; if not, its namespace
	// was read from its id alone.
	Connected bool `json:"connected"`
	// Instances are the registry instances that report the service, the
	// first of which gave it its exportTo.
	Instances []Origin `json:"instances"`
	// Conflicts are other instances' disagreements about exportTo.
	Conflicts []string `json:"conflicts,omitempty"`
	// Received are the clusters of the service the xDS server holds for
	// the node: none when it does not see the service.
	Received []string `json:"received"`
}

// Origin is one instance that reports a service.
type Origin struct {
	Plugin   string `json:"plugin"`
	Provider string `json:"provider"`
	Cluster  string `json:"cluster"`
}

// Handler serves /debug/visibilityz; nodes may be nil (no xDS server):
//
//	/debug/visibilityz?host=HOST&node=ID         whether the node sees the service, and why
//	/debug/visibilityz?host=HOST&namespace=NS    the same for a client in namespace NS
func (r *Rules) Handler(agg *aggregate.Registry, nodes Nodes) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		host, node, ns := q.Get("host"), q.Get("node"), q.Get("namespace")
		if host == "" || (node == "") == (ns == "" && !q.Has("namespace")) {
			http.Error(w, "want host=HOST and one of node=ID or namespace=NS", http.StatusBadRequest)
			return
		}
		svc := agg.GetService(host)
		if svc == nil {
			http.Error(w, fmt.Sprintf("no service %q in any registry (see /debug/registryz)", host), http.StatusNotFound)
			return
		}
		ex := &Explanation{Node: node, Received: []string{}}
		if node != "" {
			ns = model.NodeNamespace(node, "")
			if nodes != nil {
				if n, clusters, ok := nodes.NodeClusters(node, host); ok {
					ns, ex.Connected, ex.Received = n, true, clusters
				}
			}
		}
		ex.Decision = r.Decide(svc, ns)
		for _, k := range svc.Instances {
			ex.Instances = append(ex.Instances, Origin{Plugin: k.Plugin, Provider: k.Provider, Cluster: k.Cluster})
		}
		for _, c := range svc.Conflicts {
			if c.Field == "export_to" {
				ex.Conflicts = append(ex.Conflicts, fmt.Sprintf("%s: %s (kept %s)", c.Loser, c.Detail, c.Winner))
			}
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(ex)
	})
}
