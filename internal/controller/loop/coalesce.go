package loop

import (
	"context"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Coalescing is an event handler that enqueues one request (the budget's, the memory
// policy's) a while after a change, so that the changes of that while make one pass (the
// delaying queue keeps the earliest time of one key).
type Coalescing struct {
	// Delay is how long after a change the request is enqueued.
	Delay time.Duration
	// Req is the one request every change enqueues.
	Req reconcile.Request
}

func (c Coalescing) add(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	q.AddAfter(c.Req, c.Delay)
}

// Create enqueues the request.
func (c Coalescing) Create(_ context.Context, _ event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}

// Update enqueues the request.
func (c Coalescing) Update(_ context.Context, _ event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}

// Delete enqueues the request.
func (c Coalescing) Delete(_ context.Context, _ event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}

// Generic enqueues the request.
func (c Coalescing) Generic(_ context.Context, _ event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}
