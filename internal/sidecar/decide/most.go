package decide

// Most is the largest hold of the request, over every rule that holds (Shadow rules too): a
// response that reported no usage but streamed more than it is charged what it streamed,
// never less than any of its holds.
func (h *Holds) Most() int64 {
	var most int64
	if h == nil {
		return 0
	}
	for _, x := range h.holds {
		most = max(most, x.hold.Units)
	}
	return most
}
