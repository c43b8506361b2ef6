package controller

import (
	"slices"

	"github.com/redline-dev/redline/internal/controller/budget"
	"github.com/redline-dev/redline/internal/controller/memorypolicy"
	"github.com/redline-dev/redline/internal/controller/policies"
)

// Collectors are the manager's own collectors, each registered by its loop on
// controller-runtime's registry (which serves /metrics beside controller-runtime's and Go's):
// the list the metrics reference (internal/docgen) is generated from, so a collector cannot be
// registered without being documented.
var Collectors = slices.Concat(policies.Collectors, budget.Collectors, memorypolicy.Collectors)
