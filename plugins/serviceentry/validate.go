package serviceentry

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/estuary-mesh/estuary/sdk/istio"
)

// unixPrefix marks a Unix domain socket address, as in Istio.
const unixPrefix = "unix://"

// portNameRE is the rule Istio's CRDs apply to port names.
var portNameRE = regexp.MustCompile(`^[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?$`)

// portProtocol reads a ServiceEntry port's protocol as Istio's
// protocol.Parse does. A port that names none is reported as TCP, as the
// other registries report a port whose protocol Istio would sniff.
func portProtocol(p string) (istio.Protocol, bool) {
	if p == "" {
		return istio.TCP, true
	}
	proto := istio.ParseProtocol(p)
	return proto, proto.Known()
}

// validateServiceEntry checks what Istio's CRD schema and validating webhook
// check, plus what this registry cannot represent. Errors reject the entry;
// warnings do not.
func validateServiceEntry(se *networking.ServiceEntry) (errs fieldErrors, warnings []string) {
	res := se.GetResolution()

	if len(se.GetHosts()) == 0 {
		errs.add("spec.hosts", "missing: a ServiceEntry needs at least one host")
	}
	// Istio checks the hosts of a DNS entry without inline endpoints, with
	// or without a workload selector.
	dnsHostsAsEndpoints := isDNS(res) && len(se.GetEndpoints()) == 0
	seen := map[string]bool{}
	for i, h := range se.GetHosts() {
		path := fmt.Sprintf("spec.hosts[%d]", i)
		if err := checkHost(h); err != nil {
			errs.add(path, "%v", err)
			continue
		}
		if seen[h] {
			// Istio accepts it; the second is the same service.
			warnings = append(warnings, fmt.Sprintf("%s: host %q is listed twice; read once", path, h))
		}
		seen[h] = true
		if dnsHostsAsEndpoints && strings.HasPrefix(h, "*") {
			errs.add(path, "wildcard host %q needs endpoints with resolution %s (the host itself cannot be resolved)", h, res)
		}
	}

	ports := se.GetPorts()
	names, numbers := map[string]bool{}, map[uint32]bool{}
	for i, p := range ports {
		path := fmt.Sprintf("spec.ports[%d]", i)
		switch n := p.GetNumber(); {
		case n == 0:
			errs.add(path+".number", "port without number")
		case n > 65535:
			errs.add(path+".number", "port %d is not between 1 and 65535", n)
		case numbers[n]:
			errs.add(path+".number", "port number %d is declared twice", n)
		}
		numbers[p.GetNumber()] = true
		switch name := p.GetName(); {
		case name == "":
			errs.add(path+".name", "port without name")
		case len(name) > 63 || !portNameRE.MatchString(name):
			errs.add(path+".name", "invalid port name %q (letters, digits and '-', at most 63)", name)
		case names[name]:
			errs.add(path+".name", "port name %q is declared twice", name)
		}
		names[p.GetName()] = true
		if _, ok := portProtocol(p.GetProtocol()); !ok {
			errs.add(path+".protocol", "unknown protocol %q (known: %s)", p.GetProtocol(), istio.KnownProtocols())
		}
		if tp := p.GetTargetPort(); tp > 65535 {
			errs.add(path+".targetPort", "port %d is not between 1 and 65535", tp)
		}
	}

	for i, a := range se.GetAddresses() {
		path := fmt.Sprintf("spec.addresses[%d]", i)
		if _, err := netip.ParseAddr(a); err == nil {
			continue
		}
		pfx, err := netip.ParsePrefix(a)
		if err != nil {
			errs.add(path, "%q is neither an IP address nor a CIDR", a)
			continue
		}
		// Istio: a CIDR (host bits set or not, any location and protocol)
		// needs resolution NONE or STATIC; a /32 is a CIDR too.
		if res != networking.ServiceEntry_NONE && res != networking.ServiceEntry_STATIC {
			errs.add(path, "CIDR %q is only allowed with resolution NONE or STATIC, not %s", pfx, res)
		}
	}

	switch res {
	case networking.ServiceEntry_DYNAMIC_DNS:
		errs.add("spec.resolution", "DYNAMIC_DNS is not supported (use DNS, DNS_ROUND_ROBIN, STATIC or NONE)")
	case networking.ServiceEntry_NONE:
		if len(se.GetEndpoints()) > 0 {
			errs.add("spec.endpoints", "resolution NONE takes no endpoints")
		}
	case networking.ServiceEntry_DNS_ROUND_ROBIN:
		if len(se.GetEndpoints()) > 1 {
			errs.add("spec.endpoints", "resolution DNS_ROUND_ROBIN takes at most one endpoint, not %d", len(se.GetEndpoints()))
		}
	}

	if sel := se.GetWorkloadSelector(); sel != nil {
		if len(se.GetEndpoints()) > 0 {
			errs.add("spec.workloadSelector", "cannot be used together with spec.endpoints")
		}
		for _, k := range sortedKeys(sel.GetLabels()) {
			if strings.Contains(sel.GetLabels()[k], "*") {
				errs.add("spec.workloadSelector.labels."+k, "wildcards are not supported in selectors")
			}
		}
	}

	for i, ep := range se.GetEndpoints() {
		path := fmt.Sprintf("spec.endpoints[%d]", i)
		errs = append(errs, checkWorkload(path, ep)...)
		if err := addressFits(ep.GetAddress(), res, len(ports)); err != nil {
			errs.add(path+".address", "%v", err)
		}
		for _, name := range sortedKeys(ep.GetPorts()) {
			if !names[name] {
				errs.add(path+".ports."+name, "the entry declares no port named %q", name)
			}
		}
	}

	exported := map[string]bool{}
	for i, e := range se.GetExportTo() {
		path := fmt.Sprintf("spec.exportTo[%d]", i)
		if exported[e] {
			errs.add(path, "%q is listed twice", e)
		}
		exported[e] = true
		switch {
		case e == "*" || e == "~":
			if len(se.GetExportTo()) > 1 {
				errs.add(path, "%q cannot be combined with other values", e)
			}
		case e == ".":
		default:
			if msgs := validation.IsDNS1123Label(e); len(msgs) > 0 {
				errs.add(path, "%q is not \".\", \"*\", \"~\" or a namespace name: %s", e, strings.Join(msgs, "; "))
			}
		}
	}
	return errs, warnings
}

// validateWorkloadEntry checks a WorkloadEntry on its own; whether its
// address suits a ServiceEntry that selects it is checked when selecting.
func validateWorkloadEntry(we *networking.WorkloadEntry) fieldErrors {
	errs := checkWorkload("spec", we)
	a := we.GetAddress()
	if a != "" && !strings.HasPrefix(a, unixPrefix) && !isIP(a) && checkHostname(a) != nil {
		errs.add("spec.address", "%q is neither an IP address, a host name nor a unix:// path", a)
	}
	return errs
}

// checkWorkload checks the fields a WorkloadEntry has wherever it appears:
// inline in a ServiceEntry or standing alone.
func checkWorkload(path string, we *networking.WorkloadEntry) fieldErrors {
	var errs fieldErrors
	a := we.GetAddress()
	switch {
	case a == "" && we.GetNetwork() != "":
		// A network-only endpoint: reachable only through its network's
		// gateway, as Istio accepts it.
	case a == "":
		errs.add(path+".address", "missing (an endpoint without an address needs a network, whose gateway reaches it)")
	case strings.HasPrefix(a, unixPrefix):
		p := strings.TrimPrefix(a, unixPrefix)
		switch {
		case !strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "@"):
			errs.add(path+".address", "unix socket %q must be an absolute path or an abstract socket (@name)", a)
		case strings.HasSuffix(p, "/"):
			errs.add(path+".address", "unix socket %q names a directory", a)
		}
		if len(we.GetPorts()) > 0 {
			errs.add(path+".ports", "a unix socket endpoint takes no ports")
		}
	}
	for _, k := range sortedKeys(we.GetLabels()) {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs.add(path+".labels", "invalid label key %q: %s", k, strings.Join(msgs, "; "))
		}
		if msgs := validation.IsValidLabelValue(we.GetLabels()[k]); len(msgs) > 0 {
			errs.add(path+".labels."+k, "invalid label value %q: %s", we.GetLabels()[k], strings.Join(msgs, "; "))
		}
	}
	for _, name := range sortedKeys(we.GetPorts()) {
		n := we.GetPorts()[name]
		if len(name) > 63 || !portNameRE.MatchString(name) {
			errs.add(path+".ports", "invalid port name %q", name)
		}
		if n == 0 || n > 65535 {
			errs.add(path+".ports."+name, "port %d is not between 1 and 65535", n)
		}
	}
	return errs
}

// addressFits checks an endpoint address against the entry's resolution:
// IPs (or unix sockets, for STATIC) when the proxy must not resolve names,
// IPs or host names for DNS resolution.
func addressFits(a string, res networking.ServiceEntry_Resolution, ports int) error {
	switch {
	case a == "" && isDNS(res):
		// Estuary differs from Istio here: a DNS cluster carries
		// addresses to resolve, so a network-only endpoint has no place
		// in it.
		return fmt.Errorf("an endpoint without an address (network-only) needs resolution STATIC, not %s", res)
	case a == "":
		return nil // network-only, or reported by checkWorkload
	case strings.HasPrefix(a, unixPrefix):
		if res != networking.ServiceEntry_STATIC {
			return fmt.Errorf("unix socket %q needs resolution STATIC, not %s", a, res)
		}
		if ports != 1 {
			return fmt.Errorf("unix socket %q needs an entry with exactly one port, not %d", a, ports)
		}
		return nil
	case isIP(a):
		return nil
	case isDNS(res):
		if err := checkHostname(a); err != nil {
			return fmt.Errorf("%q is neither an IP address nor a host name: %v", a, err)
		}
		return nil
	}
	return fmt.Errorf("%q is not an IP address (resolution %s)", a, res)
}

func isDNS(r networking.ServiceEntry_Resolution) bool {
	return r == networking.ServiceEntry_DNS || r == networking.ServiceEntry_DNS_ROUND_ROBIN
}

func isIP(a string) bool {
	_, err := netip.ParseAddr(a)
	return err == nil
}

// checkHost checks a ServiceEntry host: a DNS name, possibly with a
// leading "*." wildcard.
func checkHost(h string) error {
	switch {
	case h == "":
		return fmt.Errorf("empty host")
	case h == "*":
		return fmt.Errorf("host \"*\" is not allowed")
	}
	if err := checkHostname(strings.TrimPrefix(h, "*.")); err != nil {
		return fmt.Errorf("invalid host %q: %v", h, err)
	}
	return nil
}

func checkHostname(h string) error {
	if msgs := validation.IsDNS1123Subdomain(strings.ToLower(h)); len(msgs) > 0 {
		return fmt.Errorf("%s", strings.Join(msgs, "; "))
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
