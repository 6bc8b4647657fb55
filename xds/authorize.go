package xds

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/estuary-mesh/estuary/host/model"
)

// certIdentity is the SPIFFE ID of a verified client certificate. A SPIFFE
// certificate carries exactly one URI SAN that is a SPIFFE ID; a
// certificate with none, or with two, names no one.
func certIdentity(cert *x509.Certificate) (model.Identity, error) {
	var ids []string
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" {
			ids = append(ids, u.String())
		}
	}
	switch len(ids) {
	case 0:
		return model.Identity{}, errors.New("the client certificate has no SPIFFE ID (a URI SAN spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT)")
	case 1:
		return model.ParseSPIFFEID(ids[0])
	default:
		return model.Identity{}, fmt.Errorf("the client certificate has %d SPIFFE IDs (%s); a SPIFFE certificate has exactly one", len(ids), strings.Join(ids, ", "))
	}
}

// peerIdentity is the identity of a stream's client, from the certificate
// chain the TLS handshake verified. ok is false when the connection
// carries no verified certificate (plain text, or TLS without client
// certificates).
func peerIdentity(ctx context.Context) (id model.Identity, ok bool, err error) {
	p, found := peer.FromContext(ctx)
	if !found {
		return model.Identity{}, false, nil
	}
	info, isTLS := p.AuthInfo.(credentials.TLSInfo)
	if !isTLS || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return model.Identity{}, false, nil
	}
	id, err = certIdentity(info.State.VerifiedChains[0][0])
	return id, err == nil, err
}

// Policy is what a client's identity allows its node to claim. Whatever
// the policy, a node's namespace must be its identity's, as istiod
// requires: the namespace decides which proxy a workload is.
type Policy struct {
	// Routers are the SPIFFE IDs that may connect as east-west gateways
	// (node ids "router~..."). Empty: no one may.
	Routers []string
	// TrustDomains, if not nil, lists the trust domains whose identities
	// may connect at all, each with the CLUSTER_IDs and NETWORKs (the
	// node's own and those it requests to see) its nodes may claim; an
	// empty list allows any value.
	TrustDomains map[string]TrustDomainPolicy
}

// TrustDomainPolicy is what the nodes of one trust domain may claim.
type TrustDomainPolicy struct {
	Clusters, Networks []string
}

// Claims that a refusal names, the label of estuary_xds_denied_total.
const (
	claimIdentity    = "identity"
	claimNamespace   = "namespace"
	claimRouter      = "router"
	claimTrustDomain = "trust_domain"
	claimCluster     = "cluster"
	claimNetwork     = "network"
	claimNode        = "node"
)

// denial is a refused claim: what was claimed and why it is refused.
type denial struct {
	claim string
	msg   string
}

// nodeNamespace is the namespace an Istio node id claims:
// TYPE~IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN. The DNS domain names it;
// the pod's name.namespace, when dotted, and the NAMESPACE metadata, when
// sent, must agree with it, so a node cannot claim two.
func nodeNamespace(n *corev3.Node) (string, error) {
	parts := strings.Split(n.GetId(), "~")
	if len(parts) != 4 {
		return "", fmt.Errorf("node id %q is not TYPE~IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN", n.GetId())
	}
	ns, _, _ := strings.Cut(parts[3], ".")
	if ns == "" {
		return "", fmt.Errorf("node id %q names no namespace in its DNS domain %q", n.GetId(), parts[3])
	}
	if i := strings.LastIndexByte(parts[2], '.'); i >= 0 && parts[2][i+1:] != ns {
		return "", fmt.Errorf("node id %q names two namespaces, %q and %q", n.GetId(), parts[2][i+1:], ns)
	}
	if md := n.GetMetadata().GetFields()[metaNamespace].GetStringValue(); md != "" && md != ns {
		return "", fmt.Errorf("node id %q names namespace %q but its NAMESPACE metadata says %q", n.GetId(), ns, md)
	}
	return ns, nil
}

// check decides whether the node n (parsed as parsed) may connect under
// identity id. It returns nil or the first refused claim.
func (p *Policy) check(id model.Identity, n *corev3.Node, parsed model.Node) *denial {
	ns, err := nodeNamespace(n)
	if err != nil {
		return &denial{claimNamespace, fmt.Sprintf("%v; identity %s", err, id)}
	}
	if ns != id.Namespace {
		return &denial{claimNamespace, fmt.Sprintf("node %q claims namespace %q, but identity %s is in namespace %q", n.GetId(), ns, id, id.Namespace)}
	}
	if parsed.Kind == model.KindRouter && (p == nil || !slices.Contains(p.Routers, id.String())) {
		return &denial{claimRouter, fmt.Sprintf("node %q claims to be an east-west gateway (router~), but identity %s is not in xds authorize routers", n.GetId(), id)}
	}
	if p == nil || p.TrustDomains == nil {
		return nil
	}
	td, ok := p.TrustDomains[id.TrustDomain]
	if !ok {
		return &denial{claimTrustDomain, fmt.Sprintf("identity %s: trust domain %q is not in xds authorize", id, id.TrustDomain)}
	}
	if len(td.Clusters) > 0 && !slices.Contains(td.Clusters, parsed.ClusterID) {
		return &denial{claimCluster, fmt.Sprintf("node %q claims CLUSTER_ID %q, but identity %s may claim only %s", n.GetId(), parsed.ClusterID, id, quoteList(td.Clusters))}
	}
	if len(td.Networks) > 0 {
		for _, nw := range append([]string{parsed.Network}, parsed.RequestedNetworks...) {
			if !slices.Contains(td.Networks, nw) {
				return &denial{claimNetwork, fmt.Sprintf("node %q claims NETWORK %q, but identity %s may claim only %s", n.GetId(), nw, id, quoteList(td.Networks))}
			}
		}
	}
	return nil
}

func quoteList(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}
