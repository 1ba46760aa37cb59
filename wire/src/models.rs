//! `GET /v1/models`: the page of models and one model object. Which models a
//! fake lists is its own choice; how they are written is this.

use serde::Serialize;

/// One model as `GET /v1/models` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Model {
    /// When it was released (RFC 3339).
    pub created_at: &'static str,
    /// Its name for people (`Claude Sonnet 4.5`).
    pub display_name: &'static str,
    /// Its id (`claude-sonnet-4-5-20250929`).
    pub id: &'static str,
}

impl Model {
    /// The model `id`, called `display_name`, released at `created_at`.
    pub const fn new(id: &'static str, display_name: &'static str, created_at: &'static str) -> Model {
        Model { created_at, display_name, id }
    }
}

// Fields are written in the order both fakes have always sent them
// (alphabetical), spelled out so that no serde_json feature can reorder them.

#[derive(Serialize)]
struct Object<'a> {
    #[serde(flatten)]
    model: &'a Model,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct Page<'a> {
    data: Vec<Object<'a>>,
    first_id: Option<&'static str>,
    has_more: bool,
    last_id: Option<&'static str>,
}

/// The model object of `GET /v1/models/{id}`.
pub fn object(model: &Model) -> String {
    serde_json::to_string(&Object { model, kind: "model" }).expect("a model serializes")
}

/// The one page of `GET /v1/models` listing `models` in order.
pub fn page(models: &[Model]) -> String {
    let page = Page {
        data: models.iter().map(|model| Object { model, kind: "model" }).collect(),
        first_id: models.first().map(|m| m.id),
        has_more: false,
        last_id: models.last().map(|m| m.id),
    };
    serde_json::to_string(&page).expect("models serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODELS: &[Model] = &[
        Model::new("claude-opus-4-1-20250805", "Claude Opus 4.1", "2025-08-05T00:00:00Z"),
        Model::new("claude-fable-5", "Claude Fable 5", "2026-06-01T00:00:00Z"),
    ];

    #[test]
    fn the_page_lists_every_model_with_the_first_and_last_id() {
        assert_eq!(
            page(MODELS),
            concat!(
                r#"{"data":[{"created_at":"2025-08-05T00:00:00Z","display_name":"Claude Opus 4.1","id":"claude-opus-4-1-20250805","type":"model"},"#,
                r#"{"created_at":"2026-06-01T00:00:00Z","display_name":"Claude Fable 5","id":"claude-fable-5","type":"model"}],"#,
                r#""first_id":"claude-opus-4-1-20250805","has_more":false,"last_id":"claude-fable-5"}"#
            )
        );
        assert_eq!(page(&[]), r#"{"data":[],"first_id":null,"has_more":false,"last_id":null}"#);
    }

    #[test]
    fn a_model_object_is_one_entry_of_the_page() {
        assert_eq!(
            object(&MODELS[1]),
            r#"{"created_at":"2026-06-01T00:00:00Z","display_name":"Claude Fable 5","id":"claude-fable-5","type":"model"}"#
        );
    }
}
