package engine

// mockWords is the mock engine's vocabulary: 256 plain English words. Changing
// it changes every mock output, which tests and recorded runs depend on.
var mockWords = [256]string{
	"the", "of", "and", "to", "in", "is", "was", "for", "on", "that",
	"with", "as", "by", "at", "from", "his", "her", "they", "this", "be",
	"are", "or", "it", "not", "have", "had", "but", "one", "all", "an",
	"were", "which", "she", "their", "there", "been", "has", "when", "who", "will",
	"more", "no", "if", "out", "so", "said", "what", "up", "its", "about",
	"into", "than", "them", "can", "only", "other", "new", "some", "could", "time",
	"these", "two", "may", "then", "do", "first", "any", "my", "now", "such",
	"like", "our", "over", "man", "me", "even", "most", "made", "after", "also",
	"did", "many", "before", "must", "through", "back", "years", "where", "much", "your",
	"way", "well", "down", "should", "because", "each", "just", "those", "people", "how",
	"too", "little", "state", "good", "very", "make", "world", "still", "own", "see",
	"men", "work", "long", "get", "here", "between", "both", "life", "being", "under",
	"never", "day", "same", "another", "know", "while", "last", "might", "us", "great",
	"old", "year", "off", "come", "since", "against", "go", "came", "right", "used",
	"take", "three", "states", "himself", "few", "house", "use", "during", "without", "again",
	"place", "around", "however", "home", "small", "found", "thought", "went", "say", "part",
	"once", "general", "high", "upon", "school", "every", "does", "got", "united", "left",
	"number", "course", "war", "until", "always", "away", "something", "fact", "though", "water",
	"less", "public", "put", "think", "almost", "hand", "enough", "far", "took", "head",
	"yet", "government", "system", "better", "set", "told", "nothing", "night", "end", "why",
	"called", "find", "going", "look", "asked", "later", "knew", "point", "next", "city",
	"program", "business", "give", "group", "toward", "young", "days", "let", "room", "president",
	"side", "social", "given", "present", "several", "order", "national", "possible", "rather", "second",
	"face", "per", "among", "form", "important", "often", "things", "looked", "early", "white",
	"case", "john", "become", "large", "big", "need", "four", "within", "felt", "along",
	"children", "saw", "best", "church", "ever", "least",
}
