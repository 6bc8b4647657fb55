package consul

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/hashicorp/consul/api"
)

// defaultName is the name of Consul Enterprise's default namespace and
// default admin partition, which are also all CE has.
const defaultName = "default"

// scope is one (admin partition, namespace) pair of Consul Enterprise,
// by Consul's names ("default" for the defaults). Every datacenter and
// peer of a block is watched in every scope of the block, each with its
// own blocking queries.
type scope struct{ partition, namespace string }

var defaultScope = scope{defaultName, defaultName}

// apply points a query at the scope. The defaults are not sent: Consul
// CE refuses any ns or partition parameter, "default" too (HTTP 400,
// "Namespaces are a Consul Enterprise feature"), and Enterprise reads
// an absent one as the default.
func (s scope) apply(q *api.QueryOptions) {
	q.Namespace, q.Partition = "", ""
	if s.namespace != defaultName {
		q.Namespace = s.namespace
	}
	if s.partition != defaultName {
		q.Partition = s.partition
	}
}

// String names the scope in messages: "" for the default one,
// "namespace team-a", "partition p1" or "partition p1, namespace team-a".
func (s scope) String() string {
	var parts []string
	if s.partition != defaultName {
		parts = append(parts, "partition "+s.partition)
	}
	if s.namespace != defaultName {
		parts = append(parts, "namespace "+s.namespace)
	}
	return strings.Join(parts, ", ")
}

// key is the map key of a service of the scope: its Consul name in the
// default scope, "partition/namespace/name" in another (Consul names
// never hold a "/"), so the default scope's keys are what they always
// were and two scopes' services never share one.
func (s scope) key(name string) string {
	if s == defaultScope {
		return name
	}
	return s.partition + "/" + s.namespace + "/" + name
}

// hostSuffix is what follows the service's name in its hostname. The
// default scope keeps domain_suffix ("web.service.consul"); another adds
// the labels of Consul Enterprise's DNS, "<namespace>.ns" and
// "<partition>.ap", after the "service" label, as Consul's own
// web.service.team-a.ns.p1.ap.consul, so that one service name in two
// namespaces is two hostnames. A suffix without a leading "service"
// label takes them at its front. The datacenter label ("dc1.dc") is left
// out, as the default scope leaves it out: a namespace's service in two
// datacenters is one hostname whose endpoints are in two localities.
func (s scope) hostSuffix(domainSuffix string) string {
	var labels []string
	if s.namespace != defaultName {
		labels = append(labels, strings.ToLower(s.namespace), "ns")
	}
	if s.partition != defaultName {
		labels = append(labels, strings.ToLower(s.partition), "ap")
	}
	if len(labels) == 0 {
		return domainSuffix
	}
	scoped := strings.Join(labels, ".")
	if rest, ok := strings.CutPrefix(domainSuffix, "service."); ok {
		return "service." + scoped + "." + rest
	}
	return scoped + "." + domainSuffix
}

// validScopeName reports whether name can be a Consul namespace or
// partition here: it becomes a DNS label of the services' hostnames, so
// letters, digits and "-", at most 63, starting and ending with a letter
// or digit.
func validScopeName(name string) bool {
	if name == "" || len(name) > 63 || name[0] == '-' || name[len(name)-1] == '-' {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// notEnterprise reports whether err is Consul CE's answer to an
// Enterprise-only endpoint (/v1/namespaces, /v1/partitions): CE does not
// route them and answers 404 "Invalid URL path: not a recognized HTTP API
// endpoint". Enterprise routes them, so a 404 there says something else.
func notEnterprise(err error) bool {
	var se api.StatusError
	return errors.As(err, &se) && se.Code == http.StatusNotFound && strings.Contains(se.Body, "not a recognized HTTP API endpoint")
}

// scopes are the (partition, namespace) pairs to watch: the block's,
// with "*" expanded by asking the agent (Partitions().List, then
// Namespaces().List in each partition), once, when the config is
// applied. A CE agent, which has neither endpoint, has the default
// partition and namespace only.
func (r *run) scopes() ([]scope, bool) {
	partitions := slices.Clone(r.s.partitions)
	if r.s.allPartitions {
		listed, ok := r.listNames("partitions", defaultScope, func(q *api.QueryOptions) ([]string, error) {
			list, _, err := r.client.Partitions().List(q.Context(), q)
			var names []string
			for _, p := range list {
				if p.DeletedAt == nil {
					names = append(names, p.Name)
				}
			}
			return names, err
		})
		if !ok {
			return nil, false
		}
		partitions = union(partitions, listed)
	}
	var out []scope
	for _, p := range partitions {
		namespaces := slices.Clone(r.s.namespaces)
		if r.s.allNamespaces {
			listed, ok := r.listNames("namespaces", scope{partition: p, namespace: defaultName}, func(q *api.QueryOptions) ([]string, error) {
				list, _, err := r.client.Namespaces().List(q)
				var names []string
				for _, ns := range list {
					if ns.DeletedAt == nil {
						names = append(names, ns.Name)
					}
				}
				return names, err
			})
			if !ok {
				return nil, false
			}
			namespaces = union(namespaces, listed)
		}
		for _, ns := range namespaces {
			out = append(out, scope{partition: p, namespace: ns})
		}
	}
	return out, true
}

// listNames asks the agent for the names of its namespaces or
// partitions (what) in scope sc, retrying until it answers or the run
// ends. A CE agent's refusal is an answer: the default alone.
func (r *run) listNames(what string, sc scope, list func(*api.QueryOptions) ([]string, error)) ([]string, bool) {
	var names []string
	ok := r.retry(fmt.Sprintf("cannot list the %s of %s%s (%s = [\"*\"])", what, r.s.api.Address, inScope(sc), what), func(ctx context.Context) error {
		q := r.query(ctx, 0)
		sc.apply(q)
		var err error
		names, err = list(q)
		if notEnterprise(err) {
			r.p.log.Info("the agent is Consul CE, which has no "+what+" but the default", "error", describe(err))
			names, err = []string{defaultName}, nil
		}
		return err
	})
	return names, ok
}

// inScope is " in <scope>" for a scope other than the default one.
func inScope(s scope) string {
	if s == defaultScope {
		return ""
	}
	return " in " + s.String()
}

// union adds to names those of more it lacks, sorted, "default" first.
// An empty result is the default alone: what a CE agent has.
func union(names, more []string) []string {
	for _, n := range more {
		if !slices.ContainsFunc(names, func(m string) bool { return strings.EqualFold(m, n) }) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return []string{defaultName}
	}
	slices.SortFunc(names, func(a, b string) int {
		switch {
		case a == b:
			return 0
		case a == defaultName:
			return -1
		case b == defaultName:
			return 1
		}
		return strings.Compare(a, b)
	})
	return names
}
