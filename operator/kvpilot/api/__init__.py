"""The InferenceEngine API: schema (source of the CRD), typed models, defaults, validation, conditions."""
