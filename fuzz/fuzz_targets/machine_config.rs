//! The machine config decoder, as the Machines API reads a create request
//! (`bazaar_api::parse_body`, which is `bazaar_types::json::from_body`, into
//! `CreateMachineRequest`) and the agent checks it (`validate_config`, which is
//! `bazaar_admission::validate`). Properties: a config that decodes re-encodes to JSON that decodes to
//! the same value, and is judged the same (valid or not) both times; a config accepted has
//! no key that is not Fly's or bazaar's, and Fly's keys bazaar does not act on only at their
//! defaults (`config_fields`, judged again on the re-encoded JSON); nothing panics.
#![no_main]

use bazaar_admission::validate as validate_config;
use bazaar_types::create_request::CreateMachineRequest;
use bazaar_types::json::from_body as parse_body;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let Ok(req) = parse_body::<CreateMachineRequest>(body) else {
        return;
    };
    let Some(config) = req.config else {
        return;
    };
    let verdict = validate_config(&config).map_err(|e| e.to_string());
    let json = serde_json::to_vec(&serde_json::json!({ "config": config }))
        .expect("a decoded config encodes");
    let again = parse_body::<CreateMachineRequest>(&json)
        .unwrap_or_else(|e| panic!("the re-encoded config does not decode: {e:?}"))
        .config
        .expect("the config is still there");
    assert_eq!(again, config, "the config changed through JSON");
    assert_eq!(validate_config(&again).map_err(|e| e.to_string()), verdict);
    if verdict.is_ok() {
        let fields = bazaar_types::config_fields::check_value(&json_config(&json));
        assert!(fields.is_ok(), "an accepted config has {fields:?}");
    }
});

/// The `config` of an encoded create request, as JSON.
fn json_config(json: &[u8]) -> serde_json::Value {
    let mut request: serde_json::Value = serde_json::from_slice(json).expect("it was encoded");
    request["config"].take()
}
