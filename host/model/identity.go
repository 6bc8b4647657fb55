package model

import (
	"fmt"
	"net/url"
	"strings"
)

// Identity is a workload's SPIFFE ID in Istio's form,
// spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT: what an xDS
// client's certificate proves, and what plugins.hcl names routers by.
type Identity struct {
	TrustDomain, Namespace, ServiceAccount string
}

func (id Identity) String() string {
	return "spiffe://" + id.TrustDomain + "/ns/" + id.Namespace + "/sa/" + id.ServiceAccount
}

// ParseSPIFFEID reads a SPIFFE ID of Istio's form.
func ParseSPIFFEID(s string) (Identity, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Identity{}, fmt.Errorf("%q is not a URI: %w", s, err)
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if u.Scheme != "spiffe" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" ||
		len(parts) != 4 || parts[0] != "ns" || parts[1] == "" || parts[2] != "sa" || parts[3] == "" {
		return Identity{}, fmt.Errorf("%q is not a SPIFFE ID of the form spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT", s)
	}
	return Identity{TrustDomain: u.Host, Namespace: parts[1], ServiceAccount: parts[3]}, nil
}
