package pipeline

import (
	"fmt"
	"slices"
	"strings"

	"github.com/estuary-mesh/estuary/host/model"
	"github.com/estuary-mesh/estuary/sdk"
)

// LocalityPolicy is the mesh's locality failover (mesh.locality_failover
// and its failover rules). A service's own sdk.LocalityFailover overrides
// Enabled; the rules are the mesh's for every service.
type LocalityPolicy struct {
	Enabled  bool
	Failover []FailoverRule
}

// FailoverRule sends a client of region From to region To once its own
// region has nothing left, before any other region.
type FailoverRule struct{ From, To string }

// SetLocality sets the mesh's locality failover. Call it before Build
// runs: the policy changes only on restart, as the views that carry the
// clients' localities are decided at start-up.
func (p *Pipeline) SetLocality(lp LocalityPolicy) { p.locality = lp }

// Raw priorities, before they are made consecutive. They are Istio's
// (applyLocalityFailover): the more of region, zone and subzone an
// endpoint's locality shares with the client's, from the left, the
// earlier it comes; of the other regions, the failover rule's comes
// before the rest.
const (
	prioSubzone  = 0 // region, zone and subzone match
	prioZone     = 1 // region and zone match
	prioRegion   = 2 // region matches
	prioOther    = 3 // another region: the rule's, or any when no rule names the client's
	prioNotRuled = 4 // another region than the one the client's rule names
)

var rawPriorityMatch = [...]string{
	prioSubzone:  "same region, zone and subzone",
	prioZone:     "same region and zone",
	prioRegion:   "same region",
	prioOther:    "another region",
	prioNotRuled: "another region, not the failover rule's",
}

var rawPriorityRuled = [...]string{"another region, the failover rule's", "another region, not the failover rule's"}

// rawPriority is the priority of endpoints in locality ep for a client in
// locality client, and why: a rule's words are only written when explain
// asks for them, as Build allocates nothing.
func rawPriority(client, ep sdk.Locality, rules []FailoverRule, explain bool) (prio int, why string) {
	switch {
	case client.Region != ep.Region:
		prio = prioOther
	case client.Zone != ep.Zone:
		prio = prioRegion
	case client.Subzone != ep.Subzone:
		prio = prioZone
	default:
		prio = prioSubzone
	}
	why = rawPriorityMatch[prio]
	if prio != prioOther {
		return prio, why
	}
	// The first rule for the client's region decides, as in Istio.
	for _, r := range rules {
		if r.From != client.Region {
			continue
		}
		prio = prioNotRuled
		if ep.Region == r.To {
			prio = prioOther
		}
		if explain {
			why = fmt.Sprintf("%s (%s → %s)", rawPriorityRuled[prio-prioOther], r.From, r.To)
		}
		return prio, why
	}
	return prio, why
}

// parseLocality is sdk.ParseLocality without its allocation: Build runs
// for every CLA and allocates nothing.
func parseLocality(s string) sdk.Locality {
	var l sdk.Locality
	var rest string
	l.Region, rest, _ = strings.Cut(s, "/")
	l.Zone, l.Subzone, _ = strings.Cut(rest, "/")
	return l
}

// prioritize gives each group its priority relative to the client's
// locality, made consecutive from 0 as Envoy requires (a raw priority no
// group has is skipped), and orders the groups by priority, locality
// order within one. A gateway's group keeps the locality of the endpoints
// it stands in for, so remote endpoints keep their priority.
func (p *Pipeline) prioritize(groups []model.LocalityGroup, client string, tr *Trace) []model.LocalityGroup {
	cl := parseLocality(client)
	var used [prioNotRuled + 1]bool
	for i := range groups {
		prio, _ := rawPriority(cl, parseLocality(groups[i].Locality), p.locality.Failover, false)
		groups[i].Priority = uint32(prio)
		used[prio] = true
	}
	var final [prioNotRuled + 1]uint32
	next := uint32(0)
	for raw, u := range used {
		if u {
			final[raw] = next
			next++
		}
	}
	for i := range groups {
		raw := groups[i].Priority
		groups[i].Priority = final[raw]
		if tr != nil {
			_, why := rawPriority(cl, parseLocality(groups[i].Locality), p.locality.Failover, true)
			tr.prioritized(groups[i].Locality, int(raw), final[raw], why)
		}
	}
	// Stable: groups come sorted by locality, and stay so within a priority.
	slices.SortStableFunc(groups, func(a, b model.LocalityGroup) int { return int(a.Priority) - int(b.Priority) })
	if tr != nil {
		tr.sortResultByPriority()
	}
	return groups
}
