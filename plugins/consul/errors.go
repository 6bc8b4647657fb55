package consul

import "errors"

// errNoPeering: a configured peer is not one of the agent's peerings.
var errNoPeering = errors.New("no such peering")
