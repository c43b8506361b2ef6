package controller

import (
	"context"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// coalescing enqueues one request (the budget's, the memory policy's) a while after a change,
// so that the changes of that while make one pass (the delaying queue keeps the earliest time
// of one key).
type coalescing struct {
	delay time.Duration
	req   reconcile.Request
}

func (c coalescing) add(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	q.AddAfter(c.req, c.delay)
}

func (c coalescing) Create(_ context.Context, _ event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}

func (c coalescing) Update(_ context.Context, _ event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}

func (c coalescing) Delete(_ context.Context, _ event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}

func (c coalescing) Generic(_ context.Context, _ event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}
