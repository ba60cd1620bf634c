{{/*
CEL builders for the tenant policy (tenant-policy.yaml). Values are quoted with toJson: a JSON string is a valid
CEL string literal, so no value can change an expression's meaning.
*/}}

{{/*
"kvpilot.celMatch" (list EXPR PATTERNS IF_EMPTY): a CEL condition that the string EXPR matches one of PATTERNS
(a pattern ending in * is a prefix, any other an exact value); IF_EMPTY ("true" or "false") when there are none.
*/}}
{{- define "kvpilot.celMatch" -}}
{{- $expr := index . 0 -}}
{{- $exact := list -}}
{{- $terms := list -}}
{{- range index . 1 -}}
{{- if hasSuffix "*" . -}}
{{- $terms = append $terms (printf "%s.startsWith(%s)" $expr (trimSuffix "*" . | toJson)) -}}
{{- else -}}
{{- $exact = append $exact . -}}
{{- end -}}
{{- end -}}
{{- if $exact -}}
{{- $terms = prepend $terms (printf "%s in %s" $expr (toJson $exact)) -}}
{{- end -}}
{{- if $terms -}}
({{ join " || " $terms }})
{{- else -}}
{{ index . 2 }}
{{- end -}}
{{- end -}}

{{/*
"kvpilot.celRefused" (list EXPR ALLOWED DENIED): a CEL condition that EXPR is denied, or not allowed while an
allow list is given.
*/}}
{{- define "kvpilot.celRefused" -}}
{{- $denied := include "kvpilot.celMatch" (list (index . 0) (index . 2) "false") -}}
{{- if and (index . 1) (index . 2) -}}
({{ $denied }} || !{{ include "kvpilot.celMatch" (list (index . 0) (index . 1) "true") }})
{{- else if index . 1 -}}
!{{ include "kvpilot.celMatch" (list (index . 0) (index . 1) "true") }}
{{- else -}}
{{ $denied }}
{{- end -}}
{{- end -}}

{{/*
"kvpilot.celImageMatch" (list EXPR PATTERNS IF_EMPTY): a CEL condition that the image reference EXPR is of one of
the repositories PATTERNS ("repo" exactly, "prefix*" every repository starting so), whatever its tag or digest.
*/}}
{{- define "kvpilot.celImageMatch" -}}
{{- $expr := index . 0 -}}
{{- $terms := list -}}
{{- range index . 1 -}}
{{- $repo := regexQuoteMeta (trimSuffix "*" .) -}}
{{- $rest := ternary "[^:@]*" "" (hasSuffix "*" .) -}}
{{- $terms = append $terms (printf "%s.matches(%s)" $expr (printf "^%s%s([:@][^/]*)?$" $repo $rest | toJson)) -}}
{{- end -}}
{{- if $terms -}}
({{ join " || " $terms }})
{{- else -}}
{{ index . 2 }}
{{- end -}}
{{- end -}}

{{/*
"kvpilot.celImageRefused" (list EXPR ALLOWED DENIED): a CEL condition that the image EXPR is of a denied
repository, or of none of the allowed ones while an allow list is given.
*/}}
{{- define "kvpilot.celImageRefused" -}}
{{- $denied := include "kvpilot.celImageMatch" (list (index . 0) (index . 2) "false") -}}
{{- if and (index . 1) (index . 2) -}}
({{ $denied }} || !{{ include "kvpilot.celImageMatch" (list (index . 0) (index . 1) "true") }})
{{- else if index . 1 -}}
!{{ include "kvpilot.celImageMatch" (list (index . 0) (index . 1) "true") }}
{{- else -}}
{{ $denied }}
{{- end -}}
{{- end -}}

{{/* The patterns of a list, for a message: "a, b*", or "none". */}}
{{- define "kvpilot.patternList" -}}
{{- if . }}{{ join ", " . }}{{ else }}none{{ end -}}
{{- end -}}
