package runner

// subjectSeqs is the last stream sequence seen on each of a request's
// stored subjects: its events subject and one tokens subject per attempt,
// a handful, so a slice rather than a map (a small map takes about 250
// bytes, and a follower lives as long as its streams).
type subjectSeqs []subjectSeq

type subjectSeq struct {
	subject string
	seq     uint64
}

// get is the sequence recorded for subject, 0 if none.
func (s subjectSeqs) get(subject string) uint64 {
	for _, e := range s {
		if e.subject == subject {
			return e.seq
		}
	}
	return 0
}

// set records seq for subject.
func (s *subjectSeqs) set(subject string, seq uint64) {
	for i := range *s {
		if (*s)[i].subject == subject {
			(*s)[i].seq = seq
			return
		}
	}
	*s = append(*s, subjectSeq{subject, seq})
}
